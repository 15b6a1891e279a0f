"""Iteration-level scheduling: which sequences run in the next forward, and how much.

Every step first keeps running sequences going (in priority order), then admits waiting
ones while KV blocks, the running-sequence limit and the per-step token budget allow.
Prompts longer than the remaining budget are prefilled in chunks across steps, so a long
prompt never stalls the decodes around it. When blocks run out, the lowest-priority
running sequence is preempted: its blocks are freed and it returns to the waiting queue
to be recomputed from its tokens later (recompute beats swapping on CPU, where the
"swap space" would be the same memory).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from turboinfer.llm.engine.block_manager import BlockManager
from turboinfer.llm.engine.sequence import Sequence, SequenceStatus
from turboinfer.llm.model.config import EngineConfig


@dataclass
class SchedulerOutput:
    # seq_id -> (sequence, tokens to compute this step)
    scheduled: dict[int, tuple[Sequence, int]] = field(default_factory=dict)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled.values())


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, *,
                 lookahead: int = 0) -> None:
        self.config = config
        self.block_manager = block_manager
        # Extra KV slots a decoding sequence needs per step (speculative tokens).
        self.lookahead = lookahead
        # Tokens the whole cache holds: lookahead never asks for slots past it.
        self.capacity = block_manager.num_blocks * block_manager.block_size
        self.waiting: list[Sequence] = []   # kept sorted by Sequence.sort_key
        self.running: list[Sequence] = []   # kept sorted by Sequence.sort_key
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=Sequence.sort_key)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and give its blocks back."""
        if seq in self.running:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING or budget <= 0:
                continue
            lookahead = 0 if seq.in_prefill else min(self.lookahead,
                                                     self.capacity - seq.num_tokens)
            if not self._make_room(seq, lookahead, out):
                continue  # seq itself was the one preempted
            self.block_manager.append_slots(seq, lookahead)
            n = self._chunk(seq, budget)
            out.scheduled[seq.seq_id] = (seq, n)
            budget -= n
        while self.waiting and budget > 0 and not out.preempted:
            seq = self.waiting[0]
            if not self._admit(seq, out):
                break
            self.waiting.pop(0)
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.perf_counter()
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=Sequence.sort_key)
            n = self._chunk(seq, budget)
            out.scheduled[seq.seq_id] = (seq, n)
            budget -= n
        return out

    def _chunk(self, seq: Sequence, budget: int) -> int:
        remaining = seq.num_tokens - seq.num_computed_tokens
        if remaining == 1:
            return 1  # a decode step; speculative tokens are accounted by the engine
        return min(remaining, budget)

    def _make_room(self, seq: Sequence, lookahead: int, out: SchedulerOutput) -> bool:
        """Preempt lower-priority sequences until ``seq`` can grow; False if ``seq`` went."""
        while not self.block_manager.can_append(seq, lookahead):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _admit(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Allocate blocks for a waiting sequence, preempting strictly lower-priority
        running ones if that is what stands in the way."""
        bm = self.block_manager
        while (len(self.running) >= self.config.max_num_seqs or not bm.can_allocate(seq)):
            if not self.running or self.running[-1].sort_key()[0] <= seq.priority:
                return False
            self._preempt(self.running[-1], out)
        bm.allocate(seq)
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        out.scheduled.pop(seq.seq_id, None)
        self.block_manager.free(seq)
        seq.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.add(seq)
