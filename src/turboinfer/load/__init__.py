"""Load testing any Open Inference Protocol (KServe v2) server.

The pieces, one per module: ``inputs`` (tensors from metadata or a file), ``protocol``
(requests encoded once), ``client`` / ``http_client`` / ``grpc_client`` (transports),
``stats`` (HdrHistogram recorders), ``runner`` (closed and open loops), ``scenarios``
(single, concurrency, poisson, maxrate, soak), ``metrics`` (the server's Prometheus side),
``session`` (one run end to end), ``report`` / ``html`` / ``compare`` (output) and
``loadgen`` (the MLPerf LoadGen harness).
"""

from __future__ import annotations
