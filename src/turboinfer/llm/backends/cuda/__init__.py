"""The CUDA backend: decode steps replayed as CUDA graphs (``graphs.py``)."""
