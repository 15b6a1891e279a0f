"""Structured output: a JSON object, JSON following a schema, a regex or a Lark grammar,
enforced token by token by llguidance (the ``structured`` extra).

llguidance compiles the constraint against the tokenizer once per request and, at each
step, gives the set of tokens that keep the text inside the language as a bitmask; the
engine sets every other token's logit to -inf before sampling, so any temperature only
chooses among allowed tokens. When the text is complete the mask allows only the EOS
token.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from turboinfer.errors import InvalidInputError, MissingDependencyError
from turboinfer.llm.tokenizer import Tokenizer

Kind = Literal["json_object", "json_schema", "regex", "grammar"]
# A step's masks: the logits rows they belong to and one bitmask row each; None: none.
Masks = tuple[list[int], np.ndarray] | None
# JSON laid out as json.dumps lays it out. With llguidance's default (any whitespace
# between tokens) a small model spent its tokens on runs of spaces and newlines and ran
# out of max_tokens inside the object (16 of 20 sampled answers on the demo model).
# A schema's own "x-guidance" options still apply over these.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class StructuredOutput:
    """What the output must match; ``spec`` is the schema as JSON text, the regex or the
    Lark grammar (empty for ``json_object``)."""

    kind: Kind
    spec: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> StructuredOutput:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    def check(self) -> None:
        """Compile the spec to a grammar now (no tokenizer needed): a malformed schema,
        regex or grammar is an ``InvalidInputError`` naming it."""
        self.grammar(_llguidance().LLMatcher)

    def grammar(self, matcher_type: Any) -> str:
        """The llguidance grammar text; a malformed spec is an ``InvalidInputError``."""
        try:
            if self.kind == "json_object":
                return str(matcher_type.grammar_from_json_schema({"type": "object"},
                                                                 defaults=JSON_LAYOUT))
            if self.kind == "json_schema":
                return str(matcher_type.grammar_from_json_schema(json.loads(self.spec),
                                                                 defaults=JSON_LAYOUT))
            if self.kind == "regex":
                return str(matcher_type.grammar_from_regex(self.spec))
            return str(matcher_type.grammar_from_lark(self.spec))
        except (ValueError, TypeError) as exc:
            raise InvalidInputError(f"invalid {self.kind.replace('_', ' ')}: "
                                    f"{_first_line(str(exc))}",
                                    param="response_format") from None


class Guide:
    """One request's constraint: its matcher, fed every accepted token."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill(self, row: np.ndarray) -> None:
        """Write the allowed tokens into ``row`` (int32 words, bit i of word w: token
        32w + i)."""
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)

    @property
    def finished(self) -> bool:
        return bool(self.matcher.is_stopped())


def _first_line(message: str) -> str:
    """llguidance's errors quote the grammar over several lines; the first says what."""
    return (message.strip().splitlines() or ["unknown error"])[0]


def _llguidance() -> Any:
    try:
        import llguidance  # why: optional (the structured extra)
    except ImportError:
        raise MissingDependencyError("structured output needs llguidance: "
                                     "pip install 'turboinfer[structured]'") from None
    return llguidance


class GuideCompiler:
    """Builds each request's ``Guide`` against one tokenizer (llguidance's view of the
    vocabulary costs about a second to build, so it is built once, on first use)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_id: int | None) -> None:
        llguidance = _llguidance()
        self._matcher_type = llguidance.LLMatcher
        self.vocab_size = vocab_size
        self._tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                 eos_token=eos_token_id)

    def guide(self, structured: StructuredOutput) -> Guide:
        matcher = self._matcher_type(self._tokenizer, structured.grammar(self._matcher_type))
        if matcher.is_error():
            raise InvalidInputError(f"invalid {structured.kind.replace('_', ' ')}: "
                                    f"{_first_line(matcher.get_error())}",
                                    param="response_format")
        return Guide(matcher)

    def words(self) -> int:
        return (self.vocab_size + 31) // 32


def apply_masks(logits: torch.Tensor, rows: list[int], masks: np.ndarray) -> None:
    """Set the disallowed tokens' logits of ``rows`` to -inf, in place: in C where the
    native library loaded (float32 CPU logits; one row of a 32,000-token vocabulary in
    11 us with the call, where numpy's bit unpacking took 45), else through numpy
    or torch (``_apply_masks_python``)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 \
            and logits.is_contiguous():
        library = _native()
        if library is not None:
            index = np.asarray(rows, dtype=np.int64)
            library.apply_token_mask(logits.data_ptr(), logits.shape[1], logits.shape[1],
                                     index.ctypes.data, len(rows), masks.ctypes.data,
                                     masks.shape[1])
            return
    _apply_masks_python(logits, rows, masks)


@torch.inference_mode()  # the logits are inference tensors
def _apply_masks_python(logits: torch.Tensor, rows: list[int], masks: np.ndarray) -> None:
    """Through a numpy view of float32 CPU logits (a fifth of the time of torch's indexed
    masked_fill), else torch's masked_fill on the logits' device."""
    on_cpu = logits.device.type == "cpu"
    values = logits.numpy() if logits.dtype == torch.float32 and on_cpu else None
    vocab = logits.shape[1]
    bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    for bit_row, row in zip(bits, rows, strict=True):
        if values is not None:
            np.putmask(values[row], bit_row == 0, -np.inf)
        else:
            banned = torch.from_numpy(bit_row == 0)
            logits[row].masked_fill_(banned if on_cpu else banned.to(logits.device),
                                     float("-inf"))


_NATIVE: list[Any] = []


def _native() -> Any:
    """The native library when it built here, else None (``native_status`` says why);
    looked up once per process."""
    if not _NATIVE:
        from turboinfer.llm.backends.cpu.native import native_status  # why: compiles on first use

        _NATIVE.append(native_status().library)
    return _NATIVE[0]


class Guides:
    """The engine's side: a ``Guide`` per constrained request, and each step's masks.

    The masks for a step depend only on the tokens already accepted, so they are
    computed while the forward runs (``start``). One row is computed inline before it
    (about 30 us for a JSON schema on the demo model's vocabulary, where handing it to a
    Python thread and back cost 60 us); several go to a worker thread that hands them to
    llguidance's own thread pool at once, outside the GIL, and the forward waits for
    nothing (16 rows of SmolLM2's 49,152-token vocabulary: 1.9 ms of a 60 ms step).
    """

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int,
                 eos_token_id: int | None) -> None:
        self._source = (tokenizer, vocab_size, eos_token_id)
        self._compiler: GuideCompiler | None = None
        self._executor: Any = None
        self._worker: ThreadPoolExecutor | None = None

    def guide(self, structured: StructuredOutput) -> Guide:
        if self._compiler is None:
            tokenizer, vocab_size, eos = self._source
            if tokenizer is None:
                raise InvalidInputError("structured output needs the model's tokenizer",
                                        param="response_format")
            # Serialized here, on the first constrained request, not at every engine start.
            self._compiler = GuideCompiler(tokenizer.inner.to_str(), vocab_size, eos)
            self._executor = _llguidance().LLExecutor()
        return self._compiler.guide(structured)

    def start(self, guides: list[tuple[int, Guide]]) -> Callable[[], Masks]:
        """Begin the masks of ``(logits row, guide)`` pairs; the returned callable gives
        them (waiting for the worker when they are computed there)."""
        if len(guides) < 2 or self._compiler is None:
            masks = self.masks(guides)
            return lambda: masks
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="token-masks")
        return self._worker.submit(self.masks, guides).result

    def masks(self, guides: list[tuple[int, Guide]]) -> Masks:
        """The masks of ``(logits row, guide)`` pairs; None when there are none."""
        if not guides or self._compiler is None:
            return None
        masks = np.empty((len(guides), self._compiler.words()), dtype=np.int32)
        if len(guides) == 1:
            guides[0][1].fill(masks[0])
        else:
            self._executor.unsafe_compute_mask_ptr(
                [(g.matcher, i) for i, (_, g) in enumerate(guides)], masks.ctypes.data,
                masks.shape[1] * 4, len(guides))
        return [row for row, _ in guides], masks

    @staticmethod
    def apply(logits: torch.Tensor, masks: Masks) -> None:
        if masks is not None:
            apply_masks(logits, *masks)
