"""Beyond one process: the model repository on Ray Serve, and Kubernetes (KServe) manifests.

Nothing here re-implements serving. A Ray Serve replica runs turboinfer's own server core
over one model of the repository (its config.yaml, the engine settings ``tune`` chose,
the batcher, the OIP codec); an ingress deployment speaks the same URLs as
``turboinfer serve``. The KServe export writes manifests that run the same server image.
Ray is the ``ray`` extra, imported only by the modules that need it (``ray_app``,
``ray_llm``), and only through ``require_ray``.
"""
