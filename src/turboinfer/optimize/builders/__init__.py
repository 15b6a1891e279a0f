"""Building variants: the graph passes, FP16, the quantizers, and the steps that need a
judge on the way (the activation type, layer sensitivity, the mixed-precision search,
OpenVINO's NNCF variants). ``variants.BUILDERS`` is the registry: one builder per variant,
each reading the run's ``Context``.
"""
