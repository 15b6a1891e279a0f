"""Text <-> token ids through the ``tokenizers`` package (a folder's ``tokenizer.json``)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from turboinfer.errors import ModelLoadError


class Tokenizer:
    def __init__(self, inner: _HFTokenizer, *, eos_token_ids: tuple[int, ...] = (),
                 bos_token_id: int | None = None) -> None:
        self.inner = inner
        self.eos_token_ids = eos_token_ids
        self.bos_token_id = bos_token_id

    @classmethod
    def from_folder(cls, folder: Path, *, eos_token_ids: tuple[int, ...] = (),
                    bos_token_id: int | None = None) -> Tokenizer:
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: no tokenizer.json")
        try:
            inner = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise ModelLoadError(f"{path}: cannot read tokenizer ({exc})") from None
        return cls(inner, eos_token_ids=eos_token_ids, bos_token_id=bos_token_id)

    @property
    def vocab_size(self) -> int:
        return int(self.inner.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.inner.encode(text, add_special_tokens=False).ids
        if self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=True))
