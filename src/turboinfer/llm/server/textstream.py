"""Token ids, as they arrive, to text pieces that never have to be taken back.

Decoding each step's tokens alone would be wrong twice over: a token can end in the
middle of a UTF-8 character, and some decoders drop a leading space at the start of what
they decode. So each step decodes a small window that starts a few tokens back (vLLM's
prefix/read offsets) and keeps only what the new tokens added, once it is whole
characters. Text that could be the start of a stop string is held back until the engine
has ruled the stop out (the same rule as ``LLM.stream``), and at the end the engine's own
final text settles the rest, so the pieces always concatenate to the non-streamed text.
"""

from __future__ import annotations

from turboinfer.llm.tokenizer import Tokenizer


class TextStream:
    __slots__ = ("_holdback", "_ids", "_prefix", "_read", "_shown", "_text", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix = 0  # window start: decoded again so the new tokens see their context
        self._read = 0    # tokens before this are in _text
        self._text = ""
        self._shown = 0   # characters of _text already handed out

    def push(self, token_ids: list[int]) -> str:
        """The text that ``token_ids`` make safe to show ("" if none yet)."""
        ids = self._ids
        ids += token_ids
        decode = self._tokenizer.decode
        before = decode(ids[self._prefix:self._read]) if self._read > self._prefix else ""
        now = decode(ids[self._prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._text += now[len(before):]
            self._prefix, self._read = self._read, len(ids)
        visible = len(self._text) - self._holdback
        if visible <= self._shown:
            return ""
        piece = self._text[self._shown:visible]
        self._shown = visible
        return piece

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the engine's whole output text) after what was shown."""
        shown = self._text[:self._shown]
        if not final_text.startswith(shown):  # cannot happen with a consistent tokenizer
            return ""
        return final_text[self._shown:]
