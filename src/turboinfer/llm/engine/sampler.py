"""Logits to tokens: temperature, top-k, top-p, per-request random streams.

Pure functions over a batch: each row of ``logits`` belongs to one request and carries
its own parameters, so one call serves a whole decode step. They run on the logits'
device: on a GPU the per-row parameters go there as small tensors and the host reads
the sampled ids once (``tolist``), the step's only synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.sequence import TokenLogprob


def logits_to_probs(logits: torch.Tensor, params: Seq[SamplingParams]) -> torch.Tensor:
    """[N, V] logits -> [N, V] probabilities after each row's temperature/top-k/top-p.

    Greedy rows (temperature 0) become one-hot on the argmax, so that speculative
    acceptance treats greedy and sampled requests with the same formula.
    """
    logits = logits.float()
    vocab = logits.shape[1]
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32,
                         device=logits.device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, 1.0, temps)[:, None]
    if any(p.top_k > 0 or p.top_p < 1 for p in params if not p.greedy):
        scaled = _filter_top_k_top_p(scaled, params, vocab)
    probs = torch.softmax(scaled, dim=-1)
    # Asked of the parameters, not of ``greedy``: on a GPU that would wait for the device.
    if any(p.temperature == 0 for p in params):
        onehot = torch.zeros_like(probs)
        onehot.scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], onehot, probs)
    return probs


def _filter_top_k_top_p(scaled: torch.Tensor, params: Seq[SamplingParams],
                        vocab: int) -> torch.Tensor:
    device = scaled.device
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)            # [N, V]
    rank = torch.arange(vocab, device=device)[None, :]
    remove = rank >= top_k[:, None]
    sorted_probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
    # Drop a token once the mass before it already reaches top_p; the first always stays.
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    remove |= before >= top_p[:, None]
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, sorted_logits)


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One index per row of ``[N, V]`` non-negative weights (any scale) from ``N``
    uniforms in [0, 1), by the inverse of each row's cumulative distribution: the first
    index whose running sum exceeds u times the row's total.

    ``torch.multinomial`` took 1 ms a row over a 49,152-token vocabulary on the CPU (16 ms
    for 16 rows: a fifth of SmolLM2-135M's whole batch-16 step), whichever way it was
    called; this takes 0.5 ms for the 16. A token of zero weight (masked by a grammar,
    cut by top-k or top-p) owns an empty interval of the sum and is never drawn.
    """
    cdf = probs.cumsum(dim=-1)
    target = uniforms.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    index.clamp_(max=probs.shape[1] - 1)
    # u x total can round up to the total (about once in 2**24 draws): the row's last
    # token with weight then, never one without.
    empty = probs.gather(1, index[:, None]).squeeze(1) <= 0
    # Checked on the CPU only: on a GPU the check would wait for the device.
    if probs.device.type != "cpu" or bool(empty.any()):
        index = torch.where(empty, cdf.argmax(dim=-1), index)
    return index


def sample_from_probs(probs: torch.Tensor, generators: Seq[torch.Generator | None],
                      default: torch.Generator) -> torch.Tensor:
    """One token per row. Rows with their own generator draw their uniform from it
    (reproducible per request regardless of batch mates); the rest share ``default``."""
    shared = [i for i, g in enumerate(generators) if g is None]
    uniforms = torch.empty(probs.shape[0], device=probs.device)
    if shared:
        uniforms[shared] = torch.rand(len(shared), generator=default,
                                      device=default.device).to(probs.device)
    for i, gen in enumerate(generators):
        if gen is not None:
            uniforms[i] = torch.rand((), generator=gen, device=gen.device)
    return draw(probs, uniforms)


def draw_one(weights: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One index from a ``[V]`` row of non-negative weights (``draw`` for one row)."""
    uniform = torch.rand(1, generator=generator,
                         device=None if generator is None else generator.device)
    return int(draw(weights[None], uniform)[0])


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's first largest index, as ``logits.argmax(dim=-1)``. numpy's vectorised
    argmax: torch's CPU argmax took 2.6 ms over [16, 32000] where numpy took 0.2."""
    rows = logits.detach().float().contiguous().numpy()
    return [int(t) for t in rows.argmax(axis=-1).tolist()]


def sample(logits: torch.Tensor, params: Seq[SamplingParams],
           generators: Seq[torch.Generator | None], default: torch.Generator) -> list[int]:
    """[N, V] logits -> N token ids. An all-greedy batch is one argmax."""
    if all(p.greedy for p in params):
        if logits.device.type != "cpu":
            return [int(t) for t in logits.argmax(dim=-1).tolist()]
        return argmax_rows(logits)
    probs = logits_to_probs(logits, params)
    tokens = sample_from_probs(probs, generators, default)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        tokens[greedy] = logits[greedy].argmax(dim=-1)
    return [int(t) for t in tokens.tolist()]


def token_logprobs(logits: torch.Tensor, tokens: Seq[int], top_n: int) -> list[TokenLogprob]:
    """[N, V] logits and the N tokens drawn from them -> each token's log-probability
    under the model and the ``top_n`` most likely (id, log-probability) pairs."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)                   # [N, V]
    chosen = logprobs.gather(1, torch.tensor(tokens, dtype=torch.long,
                                             device=logits.device)[:, None])
    if top_n == 0:
        return [(lp, []) for lp in chosen.squeeze(1).tolist()]
    values, ids = logprobs.topk(top_n, dim=-1)                              # [N, top_n]
    return [(lp, list(zip(row_ids, row_vals, strict=True)))
            for lp, row_ids, row_vals in zip(chosen.squeeze(1).tolist(), ids.tolist(),
                                             values.tolist(), strict=True)]
