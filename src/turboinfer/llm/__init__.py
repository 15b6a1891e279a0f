"""A small LLM engine: paged KV cache, continuous batching, speculative decoding.

``LLM(model_dir).generate(prompts, SamplingParams(...))`` is the entry point; the parts
(block manager, scheduler, sampler, proposers, quantization) are importable alone.
"""

from turboinfer.llm.api import LLM, RequestOutput, demo_model_dir
from turboinfer.llm.config import EngineConfig, ModelConfig, QuantMode
from turboinfer.llm.engine import LLMEngine
from turboinfer.llm.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "LLMEngine", "ModelConfig", "QuantMode", "RequestOutput",
           "SamplingParams", "demo_model_dir"]
