"""The inference server: Open Inference Protocol over HTTP and gRPC."""
