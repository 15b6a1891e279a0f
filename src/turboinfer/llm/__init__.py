"""A small LLM engine: paged KV cache, continuous batching, speculative decoding.

``LLM(model_dir).generate(prompts, SamplingParams(...))`` is the entry point; the parts
(block manager, scheduler, sampler, proposers, quantization) are importable alone:
``model/`` (the model and its loading), ``engine/`` (scheduling, blocks, sampling,
speculation) and ``backends/`` (what runs a step, and ``backends/select.py``, which
chooses). ``README.md`` beside this file maps them.
"""

from turboinfer.llm.api import LLM, RequestOutput, demo_model_dir
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.model.config import EngineConfig, ModelConfig, QuantMode

__all__ = ["LLM", "EngineConfig", "LLMEngine", "ModelConfig", "QuantMode", "RequestOutput",
           "SamplingParams", "demo_model_dir"]
