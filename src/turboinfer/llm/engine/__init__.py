"""The engine: requests in, tokens out. The scheduler picks each step's work over the
block manager's paged KV cache (prefix caching, preemption), the step backend
(``llm/backends``) runs the forward, the sampler and the speculative proposers turn
logits into tokens, structured guides mask them."""
