"""The tune: variants x engines x threads x batch sizes under a p99 SLO and an accuracy
budget. ``tuning.run_tune`` drives it; ``candidates`` is what one point of the search is,
``rounds`` times them all in interleaved rounds, ``batching`` derives the server's batching
from a latency curve, ``choice`` picks the winner beyond the noise, and ``tune_report``
(with ``html``) writes what was found. A new axis of the search (the device a candidate
runs on) belongs in ``candidates``.
"""
