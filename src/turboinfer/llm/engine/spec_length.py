"""How many tokens the draft proposes in a round: the k with the most tokens per second.

A round of k proposals costs the target's verification over k + 1 rows and the draft's k
steps, and yields the drafts the target accepts plus one token of its own. Both sides
are the machine's: on an AMD Zen 3 a verification's extra rows cost little up to k = 6,
while on a Zen 4, whose fp32 passes take up to 6 rows at once, 7 rows run as 4 + 3 and
cost 1.3x 6 (the demo target: 0.87 against 1.14 ms), and k = 4 gave 1.90x plain decoding
where k = 6 gave 1.74x (benchmarks/llm/README.md). So the cost of a round at each k is
measured when the engine is built (``measure_round_costs``: the two native calls a lone
greedy sequence's round makes, back to back, as the round makes them), and how far the
draft agrees with the target is counted as the engine runs (``SpeculationLength``); each
round takes the k with the most expected tokens per millisecond.

Agreement is counted per position: ``c_i``, the share of rounds whose first i - 1 drafts
were accepted that accept draft i too (acceptance comes in runs: a draft that agreed so
far tends to go on agreeing, so the chained conditionals fit better than one rate).
E(k) = 1 + c_1 + c_1 c_2 + ... + c_1...c_k. Each position's counts fade with its own
observations (``half_life``), so the estimate follows the workload; positions past the
chosen k are seen again in every ``probe_every``-th round, which proposes the most.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def measure_round_costs(verify: Callable[[int], object], propose: Callable[[int], object],
                        max_k: int, repeats: int = 15) -> list[float]:
    """Milliseconds of a round at k = 1..``max_k``: ``verify(k + 1)`` (the target's step
    over k + 1 rows) then ``propose(k)`` (the draft's k steps), the median of ``repeats``
    rounds per k after one untimed round each, the k's interleaved in alternating order
    so that a drift in the machine's speed reaches every k alike."""
    order = list(range(1, max_k + 1))
    for k in order:
        verify(k + 1)
        propose(k)
    times: dict[int, list[float]] = {k: [] for k in order}
    for rep in range(repeats):
        for k in order if rep % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            verify(k + 1)
            propose(k)
            times[k].append(1e3 * (time.perf_counter() - start))
    # The least of the repeats: a neighbour's burst only ever adds time. A round of more
    # proposals costs at least what one of fewer does.
    costs = [min(times[k]) for k in order]
    return [max(costs[:i + 1]) for i in range(len(costs))]


class SpeculationLength:
    """Chooses k per round from measured round costs and the tokens rounds yield.

    ``round_ms[k - 1]``: a round of k proposals. Each k's tokens per round are counted
    from the rounds run at that k (fading with ``half_life`` rounds of its own); a k not
    yet run starts from what the positions' chained acceptance, counted in every round,
    predicts for it; the first ``warmup`` rounds propose the most. Every ``probe_every``-th round runs a neighbour of the best k (the
    larger and the smaller in turn) so that the comparison stays measured: where a round
    starts changes what it yields (after a rejection the next tokens tend to be easy), so
    counts at one k predict another only roughly."""

    def __init__(self, round_ms: Sequence[float], *, half_life: float = 32.0,
                 probe_every: int = 8, prior_rounds: float = 2.0, warmup: int = 4) -> None:
        if not round_ms or min(round_ms) <= 0:
            raise ValueError("round costs must be positive, one per k")
        self.round_ms = list(round_ms)
        self.max_k = len(self.round_ms)
        self.keep_weight = 0.5 ** (1.0 / half_life)
        self.probe_every = probe_every
        self.prior_rounds = prior_rounds
        self.warmup = warmup
        # Per position i = 1..max_k (index i - 1): rounds that reached draft i (the
        # earlier ones accepted, draft i proposed) and rounds that kept it; one
        # pseudo-round at one half until real ones outweigh it.
        self._reached = [1.0] * self.max_k
        self._kept = [0.5] * self.max_k
        # Per k (index k - 1): rounds run at k and the tokens they yielded, fading.
        self._rounds = [0.0] * self.max_k
        self._tokens = [0.0] * self.max_k
        self.rounds = 0
        self.rounds_by_k = [0] * self.max_k     # all rounds recorded, by what they proposed
        self._probe_up = True

    def acceptance(self) -> list[float]:
        """c_i for i = 1..max_k: of the rounds whose first i - 1 drafts were kept and
        that proposed draft i, the share that kept it."""
        return [a / r for a, r in zip(self._kept, self._reached, strict=True)]

    def predicted_tokens(self) -> list[float]:
        """E(k) = 1 + c_1 + c_1 c_2 + ... + c_1...c_k for k = 1..max_k."""
        out, run, total = [], 1.0, 1.0
        for c in self.acceptance():
            run *= c
            total += run
            out.append(total)
        return out

    def expected_tokens(self) -> list[float]:
        """Tokens a round of k proposals yields, k = 1..max_k: its own rounds' count,
        with the prediction as ``prior_rounds`` pseudo-rounds."""
        w = self.prior_rounds
        return [(t + w * p) / (r + w) for t, r, p in
                zip(self._tokens, self._rounds, self.predicted_tokens(), strict=True)]

    def best(self) -> int:
        """The k with the most expected tokens per millisecond."""
        rates = [e / ms for e, ms in zip(self.expected_tokens(), self.round_ms, strict=True)]
        return 1 + max(range(self.max_k), key=rates.__getitem__)

    def choose(self) -> int:
        if self.rounds < self.warmup:   # every position seen before the counts decide
            return self.max_k
        k = self.best()
        if self.rounds % self.probe_every == self.probe_every - 1:
            self._probe_up = not self._probe_up
            probe = k + (1 if self._probe_up else -1)
            if 1 <= probe <= self.max_k:    # at an end, only the one neighbour, as often
                k = probe
        return k

    def record(self, proposed: int, accepted: int) -> None:
        """A round proposed ``proposed`` drafts and the target kept the first
        ``accepted`` (it then yielded ``accepted`` + 1 tokens)."""
        self.rounds += 1
        w = self.keep_weight
        for i in range(min(accepted + 1, proposed, self.max_k)):
            self._reached[i] = self._reached[i] * w + 1.0
            self._kept[i] = self._kept[i] * w + (1.0 if i < accepted else 0.0)
        # Every k's own count fades each round: one not run for a while falls back to
        # the prediction, which the positions it shares with the k's being run keep current.
        self._rounds = [r * w for r in self._rounds]
        self._tokens = [t * w for t in self._tokens]
        if 1 <= proposed <= self.max_k:
            self.rounds_by_k[proposed - 1] += 1
            self._rounds[proposed - 1] += 1.0
            self._tokens[proposed - 1] += accepted + 1

    def to_dict(self) -> dict[str, object]:
        return {"round_ms": [round(ms, 4) for ms in self.round_ms],
                "rounds_by_k": list(self.rounds_by_k),
                "expected_tokens": [round(e, 3) for e in self.expected_tokens()]}
