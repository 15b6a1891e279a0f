"""What runs a step's forward, behind one interface (``base.StepBackend``): the general
torch path on any device (``torch/packed.py``), the lean torch decoder (``torch/``), the
CPU's native steps and its measured linear kernels (``cpu/``); ``select.py`` is the one
place that chooses among them, ``runner.py`` the engine's runner that asks it at every
step. See ``llm/README.md``."""
