"""How many tokens a round proposes: the k with the most expected tokens per millisecond.

A round of k proposals costs the target's verification over k + 1 rows (and, with a
draft model, the draft's k steps) and yields the proposals the target accepts plus one
token of its own. Both sides are the machine's and the workload's: the demo target's
7-row verification costs 1.3x its 6-row one on an AMD Zen 4, whose fp32 passes take up
to 6 rows at once (7 run as 4 + 3), and there k=4 beat k=6 by 10-24%, where on a Zen 3
k=6 led; how often the draft agrees depends on the text. So the cost of a round at each k is
measured when the engine is built (``measure_round_costs``: the native calls a lone
greedy sequence's round makes, back to back, as the round makes them), and what rounds
yield is counted as the engine runs (``SpeculationLength``).

Agreement is counted per position: ``c_i``, the share of rounds whose first i - 1
proposals were kept that keep proposal i too (acceptance comes in runs: a draft that
agreed so far tends to go on agreeing, so chained conditionals fit better than one rate),
which predicts E(k) = 1 + c_1 + c_1 c_2 + ... + c_1...c_k tokens for a round of k. Where
the round starts changes what it yields (after a rejection the next tokens tend to be
easy), so a prediction from rounds of one k is only roughly right for another: a draft's
rounds also count each k's own yield and prefer it where it is fresh. k = 0 is a plain
step: where the proposals stop paying, the engine stops proposing, and keeps probing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def measure_round_costs(verify: Callable[[int], object], propose: Callable[[int], object],
                        max_k: int, repeats: int = 15) -> list[float]:
    """Milliseconds of a round at k = 0..``max_k``: ``verify(k + 1)`` (the target's step
    over k + 1 rows) then, for k >= 1, ``propose(k)`` (the draft's k steps). The least of
    ``repeats`` rounds per k after one untimed round each (a neighbour's burst only ever
    adds time), the k's interleaved in alternating order so that a drift in the machine's
    speed reaches every k alike; never less for a larger k."""
    order = list(range(max_k + 1))

    def one_round(k: int) -> None:
        verify(k + 1)
        if k:
            propose(k)

    for k in order:
        one_round(k)
    times: dict[int, list[float]] = {k: [] for k in order}
    for rep in range(repeats):
        for k in order if rep % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            one_round(k)
            times[k].append(1e3 * (time.perf_counter() - start))
    costs = [min(times[k]) for k in order]
    return [max(costs[:i + 1]) for i in range(len(costs))]


class SpeculationLength:
    """Chooses k per round from measured round costs and the tokens rounds yield.

    ``round_ms[k]``: a round of k proposals, k = 0 (a plain step) to the most. The first
    ``warmup`` rounds propose the most, so that every position is seen; then each round
    takes the best k, and every ``probe_every``-th round a neighbour of it (the larger and
    the smaller in turn), so that the comparison stays measured. Counts fade with
    ``half_life`` rounds; each k's own yield is weighed against the prediction as if the
    prediction were ``prior_rounds`` rounds of it."""

    def __init__(self, round_ms: Sequence[float], *, half_life: float = 32.0,
                 probe_every: int = 8, prior_rounds: float = 2.0, warmup: int = 4) -> None:
        if len(round_ms) < 2 or min(round_ms) <= 0:
            raise ValueError("round costs must be positive, one per k from 0 up")
        self.round_ms = list(round_ms)
        self.max_k = len(self.round_ms) - 1
        self.keep_weight = 0.5 ** (1.0 / half_life)
        self.probe_every = probe_every
        self.prior_rounds = prior_rounds
        self.warmup = warmup
        # Per position i = 1..max_k (index i - 1): rounds that reached proposal i (the
        # earlier ones kept, proposal i made) and rounds that kept it; one pseudo-round
        # at one half until real ones outweigh it.
        self._reached = [1.0] * self.max_k
        self._kept = [0.5] * self.max_k
        # Per k (index k): rounds run at k and the tokens they yielded, fading each round.
        self._rounds = [0.0] * (self.max_k + 1)
        self._tokens = [0.0] * (self.max_k + 1)
        self.rounds = 0
        self.rounds_by_k = [0] * (self.max_k + 1)  # every round recorded, by what it proposed
        self._probe_up = True
        self._truncations = 0

    def acceptance(self) -> list[float]:
        """c_i for i = 1..max_k."""
        return [a / r for a, r in zip(self._kept, self._reached, strict=True)]

    def predicted_tokens(self) -> list[float]:
        """E(k) = 1 + c_1 + c_1 c_2 + ... + c_1...c_k for k = 0..max_k."""
        out, run, total = [1.0], 1.0, 1.0
        for c in self.acceptance():
            run *= c
            total += run
            out.append(total)
        return out

    def expected_tokens(self) -> list[float]:
        """Tokens a round of k proposals yields, k = 0..max_k: its own rounds' count,
        with the prediction as ``prior_rounds`` pseudo-rounds."""
        w = self.prior_rounds
        return [(t + w * p) / (r + w) for t, r, p in
                zip(self._tokens, self._rounds, self.predicted_tokens(), strict=True)]

    def best(self, limit: int | None = None, *, own_counts: bool = True) -> int:
        """The k up to ``limit`` with the most expected tokens per millisecond."""
        top = self.max_k if limit is None else min(limit, self.max_k)
        tokens = self.expected_tokens() if own_counts else self.predicted_tokens()
        return max(range(top + 1), key=lambda k: tokens[k] / self.round_ms[k])

    def choose(self) -> int:
        """How many tokens the draft proposes this round."""
        if self.rounds < self.warmup:
            return self.max_k
        k = self.best()
        if self.rounds % self.probe_every == self.probe_every - 1:
            self._probe_up = not self._probe_up
            probe = k + (1 if self._probe_up else -1)
            if 0 <= probe <= self.max_k:    # at an end, only the one neighbour, as often
                k = probe
        return k

    def truncate(self, proposed: int) -> int:
        """For a proposer that sizes its own proposals (prompt lookup, by how long a match
        it found): how many of its ``proposed`` tokens to verify. The prediction alone
        decides (a k's own rounds would mix matches of every strength); every
        ``probe_every``-th proposal verifies one token more than the choice, so the
        position past it stays counted. (Probes of the whole proposal, up to 9 rows where
        the choice was 3, cost prompt lookup 1-4% on the repetitive workload of
        benchmarks/llm/run.py in a replay at a Zen 4's round costs.)"""
        self._truncations += 1
        if self.rounds < self.warmup:
            return proposed
        best = self.best(proposed, own_counts=False)
        return min(proposed, best + 1) if self._truncations % self.probe_every == 0 else best

    def record(self, proposed: int, accepted: int) -> None:
        """A round proposed ``proposed`` tokens and the target kept the first ``accepted``
        (the round yielded ``accepted`` + 1 tokens)."""
        self.rounds += 1
        w = self.keep_weight
        for i in range(min(accepted + 1, proposed, self.max_k)):
            self._reached[i] = self._reached[i] * w + 1.0
            self._kept[i] = self._kept[i] * w + (1.0 if i < accepted else 0.0)
        # Every k's own count fades each round: one not run for a while falls back to the
        # prediction, which the positions it shares with the k's being run keep current.
        self._rounds = [r * w for r in self._rounds]
        self._tokens = [t * w for t in self._tokens]
        if 0 <= proposed <= self.max_k:
            self.rounds_by_k[proposed] += 1
            self._rounds[proposed] += 1.0
            self._tokens[proposed] += accepted + 1

    def to_dict(self) -> dict[str, object]:
        return {"round_ms": [round(ms, 4) for ms in self.round_ms],
                "rounds_by_k": list(self.rounds_by_k),
                "expected_tokens": [round(e, 3) for e in self.expected_tokens()]}
