"""What runs a step's forward: the general torch path, the lean torch decoders, and the
CPU's native steps and measured linear kernels (``cpu/``)."""
