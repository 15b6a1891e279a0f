"""The engine loop: schedule, run one batched forward, sample, retire finished requests."""

from __future__ import annotations

import time

import torch

from turboinfer.errors import InvalidInputError
from turboinfer.llm.backends import select
from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.runner import ModelRunner
from turboinfer.llm.engine.block_manager import BlockManager
from turboinfer.llm.engine.memory_plan import plan_for_device
from turboinfer.llm.engine.sampler import logits_to_probs, sample, token_logprobs
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.scheduler import Scheduler, SchedulerOutput
from turboinfer.llm.engine.sequence import FinishReason, Sequence
from turboinfer.llm.engine.spec_length import SpeculationLength, measure_round_costs
from turboinfer.llm.engine.speculative import (
    DraftModelProposer,
    NgramProposer,
    SpecStats,
    greedy_accept,
    rejection_sample,
)
from turboinfer.llm.engine.structured import Guides
from turboinfer.llm.model.config import EngineConfig
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.tokenizer import Tokenizer


class LLMEngine:
    def __init__(self, model: LlamaModel, config: EngineConfig, *,
                 tokenizer: Tokenizer | None = None, draft: LlamaModel | None = None) -> None:
        self.model = model
        self.config = config
        self.tokenizer = tokenizer
        self.max_model_len = min(config.max_model_len or model.config.max_position_embeddings,
                                 model.config.max_position_embeddings)
        # Where the steps run: the weights' device; sampling happens there too.
        self.device = model.embed_tokens.weight.device
        self.memory_plan = plan_for_device(model, config, draft=draft)
        blocks = self.memory_plan.num_blocks
        # No sequence may outgrow the whole KV cache: it would preempt itself forever.
        self.max_seq_len = min(self.max_model_len, blocks * config.block_size)
        self.block_manager = BlockManager(blocks, config.block_size,
                                          enable_prefix_caching=config.enable_prefix_caching)
        # On a GPU one block more than the scheduler hands out: where a graphed decode
        # step's padded rows write (backends/cuda/graphs.py).
        spare = 0 if self.device.type == "cpu" else 1
        scratch = blocks if spare else None
        self.runner = ModelRunner(model, model.allocate_kv_cache(blocks + spare,
                                                                 config.block_size),
                                  backend=config.backend, scratch_block=scratch,
                                  max_batch=config.max_num_seqs)
        self.runner.prepare()
        self.proposer: DraftModelProposer | NgramProposer | None = None
        if draft is not None:
            if draft.config.vocab_size != model.config.vocab_size:
                raise InvalidInputError(
                    f"draft vocabulary ({draft.config.vocab_size}) differs from the "
                    f"target's ({model.config.vocab_size})")
            draft_runner = ModelRunner(
                draft, draft.allocate_kv_cache(blocks + spare, config.block_size),
                backend=config.backend, scratch_block=scratch, max_batch=config.max_num_seqs,
                pick_prefetch=False)
            draft_runner.prepare()
            self.proposer = DraftModelProposer(draft_runner, config.num_speculative_tokens)
        elif config.ngram_size:
            self.proposer = NgramProposer(config.ngram_size, config.num_speculative_tokens)
        lookahead = config.num_speculative_tokens if self.proposer else 0
        # A lone greedy sequence's k per round, by measured costs (engine/spec_length.py).
        self.spec_length = (self._measure_spec_length()
                            if self.proposer is not None and config.adapt_speculative_tokens
                            else None)
        self.scheduler = Scheduler(config, self.block_manager, lookahead=lookahead)
        self.spec_stats = SpecStats()
        self.generator = torch.Generator(self.device).manual_seed(0)
        self.eos_ids = set(model.config.eos_token_ids)
        if tokenizer is not None:
            self.eos_ids |= set(tokenizer.eos_token_ids)
        self._by_request: dict[str, Sequence] = {}
        # Milliseconds per token of a lone greedy sequence's plain steps (a running
        # average): how many steps a burst of decode_burst_ms takes.
        self._plain_token_ms: float | None = None
        self._bursts = True     # off for good once the runner has no one-call steps
        self.guides = Guides(tokenizer, model.config.vocab_size, min(self.eos_ids, default=None))

    # -- requests ----------------------------------------------------------------------

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, *,
                    priority: int = 0, request_id: str | None = None) -> Sequence:
        self.check_prompt(prompt_token_ids)
        seq = Sequence(prompt_token_ids, params, priority=priority, request_id=request_id,
                       device=self.device)
        if params.structured is not None:
            seq.guide = self.guides.guide(params.structured)
        self._by_request[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq

    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        """Refuse a prompt that can never run: empty, out of vocabulary, or with no room
        for one new token in the context or the whole KV cache."""
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidInputError("the prompt is empty")
        if n >= self.max_model_len:
            raise InvalidInputError(f"the prompt has {n} tokens; the context holds "
                                    f"{self.max_model_len} (prompt + at least one new token)")
        if n >= self.max_seq_len:
            raise InvalidInputError(f"the prompt has {n} tokens; the KV cache holds "
                                    f"{self.max_seq_len} (prompt + at least one new token)")
        vocab = self.model.config.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_token_ids):
            raise InvalidInputError(f"prompt token ids must be in [0, {vocab})")

    def abort(self, request_id: str) -> None:
        seq = self._by_request.pop(request_id, None)
        if seq is not None and not seq.is_finished:
            seq.finish_reason = FinishReason.ABORT
            self.scheduler.finish(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ----------------------------------------------------------------------

    def step(self) -> list[Sequence]:
        """Run one iteration; returns the sequences that got new tokens."""
        out = self.scheduler.schedule()
        if not out.scheduled:
            if self.scheduler.waiting and not self.scheduler.running:
                # Cannot happen for prompts check_prompt let in; if it does, drop that one
                # request rather than stall (or fail) every later step.
                seq = self.scheduler.waiting[0]
                seq.finish_reason = FinishReason.ABORT
                self.scheduler.finish(seq)
                self._by_request.pop(seq.request_id, None)
                return [seq]
            return []
        decodes, prefills = self._split(out)
        # A constrained request decodes plainly: its mask holds for one position at a time.
        free = [d for d in decodes if d[0].guide is None]
        speculate = (self.proposer is not None and bool(free)
                     and len(free) <= self.config.speculative_max_batch)
        plain = [d for d in decodes if d[0].guide is not None] if speculate else decodes
        updated = self._run_plain(prefills + plain)
        if speculate:
            started = time.perf_counter()
            updated += self._run_speculative([s for s, _ in free])
            if len(free) == 1 and not prefills and not plain:
                self._more_rounds(free[0][0], started)
        for seq in updated:
            if seq.is_finished:
                self._by_request.pop(seq.request_id, None)
        return updated

    def _split(self, out: SchedulerOutput) -> tuple[list[tuple[Sequence, int]],
                                                   list[tuple[Sequence, int]]]:
        decodes: list[tuple[Sequence, int]] = []
        prefills: list[tuple[Sequence, int]] = []
        for seq, n in out.scheduled.values():
            is_decode = seq.num_tokens - seq.num_computed_tokens == 1
            (decodes if is_decode else prefills).append((seq, n))
        return decodes, prefills

    def _run_plain(self, work: list[tuple[Sequence, int]]) -> list[Sequence]:
        if not work:
            return []
        if len(work) == 1 and (decoded := self._greedy_decode(*work[0])) is not None:
            return decoded
        items = []
        for seq, n in work:
            start = seq.num_computed_tokens
            done = start + n == seq.num_tokens
            items.append(StepItem(seq.token_ids[start:start + n], start, seq.block_table,
                                  1 if done else 0))
        sampled = [seq for seq, n in work if seq.num_computed_tokens + n == seq.num_tokens]
        masks_ready = self.guides.start([(i, s.guide) for i, s in enumerate(sampled)
                                         if s.guide is not None])
        logits = self.runner.run(items)
        for seq, n in work:
            seq.num_computed_tokens += n
            self.block_manager.commit(seq)
        if not sampled:
            return []
        self.guides.apply(logits, masks_ready())
        tokens = sample(logits, [s.params for s in sampled], [s.generator for s in sampled],
                        self.generator)
        for i, (seq, token) in enumerate(zip(sampled, tokens, strict=True)):
            self._append(seq, [token], logits, i)
        return sampled

    def _greedy_decode(self, seq: Sequence, n: int) -> list[Sequence] | None:
        """A lone greedy sequence's decode step as one native call that returns the
        token (``ModelRunner.greedy_rows``): no logits back in Python, no sampler; with
        no other request running or waiting, a burst of steps in one call
        (``ModelRunner.greedy_steps``, ``decode_burst_ms``). None where that does not
        apply (the step is not one token, the request wants logprobs or follows a
        grammar, or the step does not run natively)."""
        start = seq.num_computed_tokens
        if (n != 1 or start + 1 != seq.num_tokens or not _plain_greedy(seq)):
            return None
        item = StepItem(seq.token_ids[start:], start, seq.block_table, 1)
        steps = self._burst_steps(seq)
        began = time.perf_counter()
        ids = self.runner.greedy_steps(item, steps) if steps > 1 else None
        if ids is None:
            self._bursts = self._bursts and steps == 1
            ids = self.runner.greedy_rows(item)
            if ids is None:
                return None
        ms = 1e3 * (time.perf_counter() - began) / len(ids)
        self._plain_token_ms = ms if self._plain_token_ms is None else (
            0.8 * self._plain_token_ms + 0.2 * ms)
        # Every fed token now has its keys and values; the last one out has none yet.
        seq.num_computed_tokens += len(ids)
        self.block_manager.commit(seq)
        self._append(seq, ids, None, 0)
        return [seq]

    def _alone(self, seq: Sequence) -> bool:
        """``seq`` is the only request running and none waits: a burst delays no one."""
        running = self.scheduler.running
        return (self.config.decode_burst_ms > 0 and not self.scheduler.waiting
                and len(running) == 1 and running[0] is seq)

    def _burst_steps(self, seq: Sequence) -> int:
        """Plain steps for the next call: about ``decode_burst_ms`` of them (4 before
        one is timed), within the request's tokens and the context, for which cache
        slots are reserved now; 1 where there are none to reserve or no burst applies."""
        if not self._bursts or not self._alone(seq):
            return 1
        per_token = self._plain_token_ms
        steps = 4 if per_token is None else int(self.config.decode_burst_ms / per_token)
        steps = min(steps, MAX_BURST_STEPS,
                    seq.params.max_tokens - seq.num_output_tokens,
                    self.max_seq_len - seq.num_tokens + 1)
        if steps < 2 or not self.block_manager.can_append(seq, steps - 1):
            return 1
        self.block_manager.append_slots(seq, steps - 1)
        return steps

    def _more_rounds(self, seq: Sequence, started: float) -> None:
        """A lone greedy sequence's speculative rounds back to back while the engine
        step has lasted less than ``decode_burst_ms``, each reserving its lookahead as
        the scheduler does; stops where the cache has no room."""
        budget = self.config.decode_burst_ms / 1e3
        while (not seq.is_finished and _plain_greedy(seq) and self._alone(seq)
               and time.perf_counter() - started < budget):
            lookahead = min(self.scheduler.lookahead,
                            self.scheduler.capacity - seq.num_tokens)
            if lookahead < 0 or not self.block_manager.can_append(seq, lookahead):
                return
            self.block_manager.append_slots(seq, lookahead)
            self._run_speculative([seq])

    def _measure_spec_length(self) -> SpeculationLength | None:
        """Round costs at k = 0..num_speculative_tokens, measured on this machine through
        the calls a lone greedy round makes (the target's greedy rows, a draft's greedy
        steps); None where the target's rows do not run natively. The rounds write cache
        blocks no sequence holds yet (the engine is new), at a position a short prompt
        reaches."""
        max_k = self.config.num_speculative_tokens
        start = min(64, self.max_seq_len - max_k - 2)
        if start < 0 or max_k + 1 > select.NATIVE_ROWS:
            return None
        table = list(range((start + max_k + 1) // self.config.block_size + 1))
        feed = [t % self.model.config.vocab_size for t in range(1, max_k + 2)]
        propose = (self.proposer.greedy_steps if isinstance(self.proposer, DraftModelProposer)
                   else _no_draft)
        if self.runner.greedy_rows(StepItem(feed, start, table, max_k + 1)) is None:
            return None
        costs = measure_round_costs(
            lambda rows: self.runner.greedy_rows(StepItem(feed[:rows], start, table, rows)),
            lambda k: propose(feed[:1], start, table, k), max_k)
        self.runner.num_forwards = 0
        return SpeculationLength(costs)

    def _run_speculative(self, seqs: list[Sequence]) -> list[Sequence]:
        assert self.proposer is not None
        lone = len(seqs) == 1 and _plain_greedy(seqs[0])
        # A lone greedy sequence's rounds are sized by measurement (engine/spec_length.py):
        # a draft proposes the chosen k; prompt lookup's proposals are cut to the best k.
        adapt = self.spec_length if lone else None
        drafted = isinstance(self.proposer, DraftModelProposer)
        # Never draft past the context or the request's token limit.
        limits = [min(adapt.choose() if adapt and drafted
                      else self.config.num_speculative_tokens,
                      self.max_seq_len - s.num_tokens,
                      s.params.max_tokens - s.num_output_tokens - 1) for s in seqs]
        if isinstance(self.proposer, NgramProposer):
            proposals = self.proposer.propose(seqs, limits,
                                              truncate=adapt.truncate if adapt else None)
        else:
            proposals = self.proposer.propose(seqs, limits)
        items = [StepItem([s.token_ids[-1], *p.tokens], s.num_computed_tokens, s.block_table,
                          1 + len(p.tokens)) for s, p in zip(seqs, proposals, strict=True)]
        # A lone greedy sequence: the target's choice after each row in one native call.
        found = self.runner.greedy_rows(items[0]) if lone else None
        logits: torch.Tensor | None = None
        probs = None
        if found is not None:
            argmax = found
        else:
            logits = self.runner.run(items)
            params = [s.params for s, p in zip(seqs, proposals, strict=True)
                      for _ in range(1 + len(p.tokens))]
            all_greedy = all(p.greedy for p in params)
            # Greedy rows need only the argmax; probabilities only for sampled requests.
            argmax = logits.argmax(dim=-1).tolist() if all_greedy else []
            probs = None if all_greedy else logits_to_probs(logits, params)
        row = 0
        for seq, proposal in zip(seqs, proposals, strict=True):
            k = len(proposal.tokens)
            if probs is None:
                tokens = greedy_accept(argmax[row:row + k + 1], proposal.tokens)
            else:
                gen = seq.generator or self.generator
                tokens = rejection_sample(probs[row:row + k + 1], proposal, gen)
            row += k + 1
            self._record_spec(k, len(tokens))
            if adapt:
                adapt.record(k, len(tokens) - 1)
            # The last verified token plus the accepted drafts now have target KV.
            seq.num_computed_tokens += len(tokens)
            seq.num_draft_computed = min(seq.num_draft_computed, seq.num_computed_tokens)
            self._append(seq, tokens, logits, row - k - 1)
            if not seq.is_finished:
                self.block_manager.commit(seq)
        return seqs

    def _record_spec(self, drafted: int, emitted: int) -> None:
        s = self.spec_stats
        s.target_forwards += 1
        s.drafted += drafted
        s.accepted += emitted - 1
        s.emitted += emitted

    def _append(self, seq: Sequence, tokens: list[int], logits: torch.Tensor | None,
                row: int) -> None:
        """Append sampled tokens; token i came from ``logits[row + i]`` (sliced only for
        logprobs: a view per sequence per step is overhead the rest never needs; None
        where the request asked for none)."""
        if seq.params.logprobs is not None:
            assert logits is not None
            seq.logprobs += token_logprobs(logits[row:row + len(tokens)], tokens,
                                           seq.params.logprobs)
        for token in tokens:
            seq.append_token(token)
            if seq.guide is not None:
                seq.guide.accept(token)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
                # Tokens after the stop were never appended; neither are their logprobs.
                del seq.logprobs[seq.num_output_tokens:]
                return

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        p = seq.params
        if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return FinishReason.STOP
        if seq.guide is not None and seq.guide.finished:
            return FinishReason.STOP  # the constrained text is complete
        if p.stop and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids)
            hits = [text.find(s) for s in p.stop if s in text]
            if hits:
                seq.output_text = text[:min(hits)]
                return FinishReason.STOP
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_seq_len:
            return FinishReason.LENGTH
        return None

    # -- reporting ---------------------------------------------------------------------

    def cache_usage(self) -> tuple[int, int, int]:
        """(used blocks, total blocks, slots holding a running sequence's token)."""
        running = self.scheduler.running
        return (self.block_manager.num_used_blocks, self.block_manager.num_blocks,
                sum(s.num_tokens for s in running))


# The most plain steps one burst takes, whatever the clock says (a model whose step is
# microseconds would otherwise hold the engine for hundreds of tokens' bookkeeping).
MAX_BURST_STEPS = 32


def _no_draft(feed: list[int], start: int, table: list[int], steps: int) -> list[int]:
    """Prompt lookup's proposal, as far as a round's cost goes: no model runs."""
    return []


def _plain_greedy(seq: Sequence) -> bool:
    """Greedy, without logprobs or a grammar: its tokens are the logits' argmax alone."""
    return seq.params.greedy and seq.params.logprobs is None and seq.guide is None
