"""The model: its configuration, the Llama-family decoder and its layers (attention over
the paged KV cache, mixture-of-experts blocks, offloaded experts), weight loading
(safetensors folders, GGUF files) and weight-only quantization. Nothing here knows how a
step is scheduled or which backend runs it."""
