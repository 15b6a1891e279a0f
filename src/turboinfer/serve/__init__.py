"""The inference server: Open Inference Protocol (KServe v2) over HTTP and gRPC.

A request's way through the modules::

    http_infer.py / grpc_service.py   transport: bytes -> InferRequest (protocol.py codec)
    core.py                           routing to a served version; metadata, config, stats
    repository.py                     which versions serve (sources.py reads the folders)
    version.py                        cheap input checks, then the version's batcher
    batcher.py                        batches dispatched to free instances, split back
    batch_queue.py                    bounded priority queue; what makes a batch
    instances.py                      K sessions, one thread each
    metrics.py                        Prometheus series and Triton's statistics JSON

``server.py`` runs it all on one event loop (uvicorn for HTTP, grpc.aio for gRPC) and owns
the lifecycle (``drain.py`` counts the requests inside for the shutdown); ``app.py`` holds
the control-plane HTTP routes. Every door answers a failure with ``errors.reply_for``.
The repository format is ``config.py``, shared with ``turboinfer tune``.
"""
