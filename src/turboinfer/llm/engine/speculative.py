"""Speculative decoding: cheap proposals, one target forward to verify them all.

Acceptance follows Leviathan et al. / Chen et al.: draft token d (drawn from q) is kept
with probability min(1, p(d)/q(d)); at the first rejection a replacement is drawn from
norm(max(0, p - q)); if all k are kept a bonus token is drawn from the target's next
distribution. The result is distributed exactly as sampling from p alone. Greedy
requests have one-hot p and q, which turns the rule into "keep while the target's
argmax agrees", so greedy output is identical to plain greedy decoding.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.runner import ModelRunner
from turboinfer.llm.backends.torch.lean_decode import SingleSequenceDecoder
from turboinfer.llm.engine.sampler import draw_one, logits_to_probs, sample_from_probs
from turboinfer.llm.engine.sequence import Sequence


@dataclass
class Proposal:
    tokens: list[int]
    probs: torch.Tensor | None  # [k, V] draft distribution; None: deterministic (one-hot)


def rejection_sample(target_probs: torch.Tensor, proposal: Proposal,
                     generator: torch.Generator | None = None) -> list[int]:
    """target_probs: [k+1, V] for the positions after each draft token (and one more).

    Returns the accepted draft tokens followed by one token from the target.
    """
    k = len(proposal.tokens)
    if k == 0:
        return [draw_one(target_probs[0], generator)]
    # On the target probabilities' device (the generator is made there, too).
    device = target_probs.device
    draft = torch.tensor(proposal.tokens, dtype=torch.long, device=device)
    rows = torch.arange(k, device=device)
    if proposal.probs is None:
        q = torch.zeros(k, target_probs.shape[1], device=device)
        q[rows, draft] = 1.0
    else:
        q = proposal.probs
    p_d = target_probs[rows, draft]
    q_d = q[rows, draft]
    u = torch.rand(k, generator=generator, device=device)
    # Strict "<" keeps u == 0 from accepting a token the target gives zero mass.
    rejected = (u * q_d >= p_d).nonzero()
    if rejected.numel() == 0:
        return [*proposal.tokens, draw_one(target_probs[k], generator)]
    m = int(rejected[0, 0])
    residual = (target_probs[m] - q[m]).clamp(min=0)
    if float(residual.sum()) <= 0:
        residual = target_probs[m]
    return [*proposal.tokens[:m], draw_one(residual, generator)]


def greedy_accept(target_argmax: list[int], draft: list[int]) -> list[int]:
    """``rejection_sample`` for one-hot target and draft distributions, without tensors:
    keep drafts while they equal the target's argmax, then emit the target's token."""
    out = []
    for proposed, wanted in zip(draft, target_argmax, strict=False):
        if proposed != wanted:
            break
        out.append(proposed)
    return [*out, target_argmax[len(out)]]


class NgramProposer:
    """Prompt-lookup drafting: find the latest earlier occurrence of the sequence's
    longest suffix of up to ``max_ngram`` tokens and propose the tokens that followed it.

    How many: the longer the suffix that matched, the likelier the sequence is copying
    earlier text, so a match of n tokens proposes n(n + 1) / 2 of them (1, 3, 6 for n =
    1, 2, 3); a proposal accepted whole says the copying goes on, so the next one is at
    least twice as long; never fewer than ``min_tokens`` nor more than ``num_tokens``.
    Long proposals cost verification work (a target forward over more rows: on the demo
    target a second row costs 7% more than the first, 8 more rows 88%), so they are spent
    where copying is likely. Replayed on the greedy outputs of the repetitive workload
    (benchmarks/llm/run.py) with those costs: 2.31 tokens per target forward and 1.83x
    against 2.00 and 1.68x for proposals of 1 doubling while accepted; on 32 prompts of
    the same kind the benchmark does not use, 2.27 and 1.80x against 1.91 and 1.63x; on
    the non-repetitive demo prompts 1.11x either way.
    """

    def __init__(self, max_ngram: int, num_tokens: int, min_tokens: int = 1) -> None:
        self.max_ngram = max_ngram
        self.num_tokens = num_tokens
        self.min_tokens = min(min_tokens, num_tokens)
        # Per sequence: where its last proposal starts, the proposal.
        self._last: weakref.WeakKeyDictionary[Sequence, tuple[int, list[int]]] = (
            weakref.WeakKeyDictionary())
        # Per sequence: where each token occurs, grown as the sequence grows.
        self._index: weakref.WeakKeyDictionary[Sequence, TokenIndex] = (
            weakref.WeakKeyDictionary())

    def propose(self, seqs: Seq[Sequence], limits: Seq[int], *,
                truncate: Callable[[int], int] | None = None) -> list[Proposal]:
        """``truncate``: how many of a proposal's tokens to keep (the engine's measured
        choice, engine/spec_length.py); all where None."""
        out = []
        for seq, limit in zip(seqs, limits, strict=True):
            index = self._index.get(seq)
            if index is None:
                index = self._index[seq] = TokenIndex()
            found, matched = self._lookup(seq.token_ids, min(limit, self.num_tokens),
                                          index.update(seq.token_ids))
            want = max(self.min_tokens, matched * (matched + 1) // 2, self._grown(seq))
            tokens = found[:want]
            if truncate is not None and tokens:
                tokens = tokens[:truncate(len(tokens))]
            if tokens:
                self._last[seq] = (seq.num_tokens, tokens)
            else:
                self._last.pop(seq, None)
            out.append(Proposal(tokens, None))
        return out

    def _grown(self, seq: Sequence) -> int:
        """Twice the last proposal's length if it was accepted whole, else 0."""
        last = self._last.get(seq)
        if last is None:
            return 0
        start, tokens = last
        return 2 * len(tokens) if seq.token_ids[start:start + len(tokens)] == tokens else 0

    def _lookup(self, tokens: list[int], k: int,
                index: TokenIndex | None = None) -> tuple[list[int], int]:
        """The latest position whose preceding tokens match the longest suffix (at most
        ``max_ngram``); its continuation, at most ``k`` tokens, and how many tokens
        matched (0: none). With ``index`` (``tokens``' own) only the last token's earlier
        occurrences are tried; without, a backward scan finds them (the same answer: at
        2,000 tokens the scan took 47 us a round, a tenth of the demo target's
        verification)."""
        total = len(tokens)
        if k <= 0 or total < 2:
            return [], 0
        last, best, best_len = tokens[-1], -1, 0
        ends = (reversed(index.positions.get(last, ())) if index is not None
                else range(total - 2, -1, -1))
        for end in ends:
            if tokens[end] != last or end >= total - 1:
                continue
            n = 1
            while (n < self.max_ngram and end - n >= 0
                   and tokens[end - n] == tokens[total - 1 - n]):
                n += 1
            if n > best_len:
                best, best_len = end, n
                if n == self.max_ngram:
                    break
        return ([], 0) if best < 0 else (tokens[best + 1:best + 1 + k], best_len)


class TokenIndex:
    """Where each token of a sequence that only grows occurs (positions ascending)."""

    def __init__(self) -> None:
        self.positions: dict[int, list[int]] = {}
        self.length = 0

    def update(self, tokens: list[int]) -> TokenIndex:
        """Indexed up to ``len(tokens)``; rebuilt if ``tokens`` got shorter."""
        if len(tokens) < self.length:
            self.positions, self.length = {}, 0
        for i in range(self.length, len(tokens)):
            self.positions.setdefault(tokens[i], []).append(i)
        self.length = len(tokens)
        return self


class DraftModelProposer:
    """A small model with its own KV cache that shares the target's block tables (same
    block size and count), so the scheduler's allocation covers both."""

    def __init__(self, runner: ModelRunner, num_tokens: int) -> None:
        self.runner = runner
        self.num_tokens = num_tokens
        self.generator = torch.Generator(runner.kv_cache.k.device).manual_seed(0)
        # The lean single-sequence decoder is the CPU's; elsewhere the runner steps.
        self.single = (SingleSequenceDecoder(runner.model, runner.kv_cache)
                       if runner.kv_cache.k.device.type == "cpu" else None)

    def propose(self, seqs: Seq[Sequence], limits: Seq[int]) -> list[Proposal]:
        steps = max(min(lim, self.num_tokens) for lim in limits)
        if steps <= 0:
            return [Proposal([], None) for _ in seqs]
        if len(seqs) == 1 and seqs[0].params.greedy:
            return [Proposal(self._propose_greedy_one(seqs[0], steps), None)]
        tokens: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        # First step catches the draft cache up (prompt, accepted tokens); later steps
        # feed back one proposed token each.
        feeds = [s.token_ids[s.num_draft_computed:] for s in seqs]
        starts = [s.num_draft_computed for s in seqs]
        for step in range(steps):
            active = [i for i, lim in enumerate(limits) if min(lim, self.num_tokens) > step]
            items = [StepItem(feeds[i], starts[i], seqs[i].block_table, 1) for i in active]
            logits = self.runner.run(items)
            params = [seqs[i].params for i in active]
            if all(p.greedy for p in params):
                # A greedy draft is deterministic: q is one-hot, no probabilities needed.
                drawn = logits.argmax(dim=-1).tolist()
            else:
                p = logits_to_probs(logits, params)
                drawn = sample_from_probs(p, [None] * len(active), self.generator).tolist()
            for row, i in enumerate(active):
                tokens[i].append(int(drawn[row]))
                if not seqs[i].params.greedy:
                    probs[i].append(p[row])
                starts[i] += len(feeds[i])
                feeds[i] = [int(drawn[row])]
        for i, s in enumerate(seqs):
            s.num_draft_computed = starts[i]
        return [Proposal(t, torch.stack(pr) if pr else None) for t, pr in zip(tokens, probs,
                                                                            strict=True)]

    def greedy_steps(self, feed: list[int], start: int, table: list[int],
                     steps: int) -> list[int]:
        """A lone greedy sequence's proposal: feed ``feed`` at ``start`` (the catch-up),
        then ``steps`` greedy tokens. In one native call where the draft has native
        kernels throughout (LM head included), else through the runner's native step,
        else through the lean single-sequence decoder."""
        native = self.runner.native_decoder()
        if native is not None and native.can_run_greedy():
            return native.greedy(feed, start, table, steps)
        if native is not None or self.single is None:
            return self._native_greedy(feed, start, table, steps)
        return self.single.greedy(feed, start, table, steps)

    def _propose_greedy_one(self, seq: Sequence, steps: int) -> list[int]:
        """One greedy sequence (single-stream decoding, where speculation pays most)."""
        start = seq.num_draft_computed
        tokens = self.greedy_steps(seq.token_ids[start:], start, seq.block_table, steps)
        # The catch-up and every proposed token but the last now have draft KV.
        seq.num_draft_computed = seq.num_tokens + len(tokens) - 1
        return tokens

    def _native_greedy(self, feed: list[int], start: int, table: list[int],
                       steps: int) -> list[int]:
        """``SingleSequenceDecoder.greedy`` through the runner, whose native one-call step
        takes the draft's steps (and the catch-up, unless it is a whole long prompt), or
        on a GPU its device's step."""
        out: list[int] = []
        while len(out) < steps:
            logits = self.runner.run([StepItem(feed, start, table, 1)])
            out.append(int(logits[0].argmax()))
            start += len(feed)
            feed = out[-1:]
        return out


@dataclass
class SpecStats:
    """Counts per sequence: one target forward verifies one sequence's proposal (the
    batch verifies many at once, but what a request gains is tokens per its forward)."""

    target_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.emitted / self.target_forwards if self.target_forwards else 0.0
