"""In-process benchmarking: latency statistics and the engine × batch-size sweep."""
