"""One request's tokens and where they live in the KV cache."""

from __future__ import annotations

import enum
import itertools
import time

import torch

from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.structured import Guide


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


_counter = itertools.count()

# A sampled token's log-probability and the ``params.logprobs`` most likely alternatives.
TokenLogprob = tuple[float, list[tuple[int, float]]]


class Sequence:
    """Prompt plus generated tokens, the block table, and the scheduling state.

    ``num_computed_tokens`` counts tokens whose keys/values are in the cache; the rest of
    ``token_ids`` still has to go through the model (a prompt chunk, or the last sampled
    token). Preemption resets it to zero: the blocks are given back and the whole
    sequence is recomputed later, which gives the same tokens because sampling state
    (the per-request generator) is kept.
    """

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, *,
                 priority: int = 0, request_id: str | None = None,
                 device: torch.device | None = None) -> None:
        self.seq_id = next(_counter)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.priority = priority
        self.arrival = time.perf_counter()
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None  # first admitted to run
        self.first_token_time: float | None = None
        self.token_times: list[float] = []
        self.output_text = ""
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            # On the device that samples: a CUDA tensor draws from a CUDA generator.
            self.generator = torch.Generator(device or "cpu").manual_seed(params.seed)
        # Draft-model progress for speculative decoding: tokens whose draft KV is cached.
        self.num_draft_computed = 0
        # Per output token, when params.logprobs is set: (its logprob, top (id, logprob)).
        self.logprobs: list[TokenLogprob] = []
        # The constraint of a structured-output request, fed each accepted token.
        self.guide: Guide | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """More than one token still to compute: a prompt (or a recompute) in progress."""
        return self.num_tokens - self.num_computed_tokens > 1

    def sort_key(self) -> tuple[int, float, int]:
        """Scheduling order: lower priority value first, then arrival."""
        return (self.priority, self.arrival, self.seq_id)

    def append_token(self, token_id: int) -> None:
        now = time.perf_counter()
        if self.first_token_time is None:
            self.first_token_time = now
        self.token_times.append(now)
        self.token_ids.append(token_id)
