"""A Hugging Face model folder (``config.json`` + weights) as a torch source to export.

Encoder models (BERT, RoBERTa, DistilBERT, ...) for two tasks:

- ``feature-extraction``: the base encoder, output ``last_hidden_state`` ``[batch,
  sequence, hidden]``;
- ``sequence-classification``: the classifier, output ``logits`` ``[batch, labels]``.

Inputs are ``input_ids`` and ``attention_mask`` (+ ``token_type_ids`` when the model takes
them), int64 ``[batch, sequence]``, both axes dynamic. The task comes from the config's
``architectures`` unless given.

optimum's ONNX exporter is not used: its ONNX package (optimum-onnx) requires
transformers < 4.58, and this project runs transformers 5; ``torch.onnx.export`` with
the task's dynamic axes gives the same graph.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from turboinfer.errors import ConfigError, ModelLoadError, UnknownModelError
from turboinfer.models.sources import TorchSource, one_line

TASKS = ("feature-extraction", "sequence-classification")
_OUTPUT = {"feature-extraction": "last_hidden_state", "sequence-classification": "logits"}
_WEIGHTS = ("*.safetensors", "*.bin")
_EXAMPLE_SHAPE = (2, 8)  # [batch, sequence]; sizes of 1 would let torch.export pin an axis


class TaskModel(torch.nn.Module):
    """Calls the HF model with positional inputs and returns the task's one output tensor."""

    def __init__(self, model: torch.nn.Module, output: str) -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, S]
        attention_mask: torch.Tensor,  # [B, S]
        token_type_ids: torch.Tensor | None = None,  # [B, S], for models that take it
    ) -> torch.Tensor:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        result = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)
        return getattr(result, self.output)


def load_hf_source(folder: Path, task: str | None = None) -> TorchSource:
    """Load the folder's model for ``task`` (inferred when ``None``) as a ``TorchSource``."""
    config = _config(folder)
    task = task or infer_task(list(getattr(config, "architectures", None) or []), folder)
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    _check_encoder(config, folder, task)
    model = _load_model(folder, task)
    names = _input_names(model)
    wrapped = TaskModel(model, _OUTPUT[task]).eval()
    examples = _examples(names, int(getattr(config, "vocab_size", 2) or 2))
    axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[_OUTPUT[task]] = {0: "batch", 1: "sequence"} if task == TASKS[0] else {0: "batch"}
    return TorchSource(folder.resolve().name, wrapped, wrapped, examples, (_OUTPUT[task],),
                       axes, (task, *_digests(folder)))


def infer_task(architectures: list[str], folder: Path) -> str:
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "sequence-classification"
    # The base model (BertModel) or a pretraining head on top of the encoder (ForMaskedLM);
    # GPT2LMHeadModel also ends in "Model" but is a decoder with an LM head.
    base = [a for a in architectures if a.endswith(("Model", "ForMaskedLM"))
            and not a.endswith("LMHeadModel")]
    if not architectures or base:
        return "feature-extraction"
    raise ModelLoadError(
        f"{folder}: architecture {architectures[0]} is not supported for export; export its "
        f"encoder with --task feature-extraction, or use one of {', '.join(TASKS)}"
    )


def _config(folder: Path) -> object:
    from transformers import AutoConfig  # 1.5 s to import: only for a Hugging Face folder

    try:
        with quiet_hub():
            return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelLoadError(f"cannot read {folder / 'config.json'}: {one_line(exc)}") from None


def _check_encoder(config: object, folder: Path, task: str) -> None:
    # transformers' own tables say which model types are encoders: they have a masked-LM
    # head and are not encoder-decoders (decoder-only LLMs have none).
    from transformers.models.auto import modeling_auto  # optional-heavy, as above

    model_type = str(getattr(config, "model_type", ""))
    encoder = (model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
               and not getattr(config, "is_encoder_decoder", False))
    if not encoder:
        raise ModelLoadError(
            f"{folder}: model type {model_type!r} is not an encoder; export supports encoder "
            "models (BERT, RoBERTa, DistilBERT...); serve decoder LLMs with `turboinfer llm`"
        )
    if (task == "sequence-classification"
            and model_type not in modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES):
        raise ModelLoadError(f"{folder}: {model_type} has no sequence-classification head; "
                             "use --task feature-extraction")


def _load_model(folder: Path, task: str) -> torch.nn.Module:
    from transformers import AutoModel, AutoModelForSequenceClassification  # 1.5 s, as above

    auto = AutoModel if task == "feature-extraction" else AutoModelForSequenceClassification
    try:
        with quiet_hub():
            model = auto.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load the model in {folder}: {one_line(exc)}") from None
    return model.eval()


@contextlib.contextmanager
def quiet_hub() -> Iterator[None]:
    """Offline, without progress bars: the files are on disk and stderr is for errors."""
    from transformers.utils import logging as hf_logging  # 1.5 s, as above

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bar = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def _input_names(model: torch.nn.Module) -> tuple[str, ...]:
    taken = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in taken:
        names.append("token_type_ids")
    return tuple(names)


def _examples(names: tuple[str, ...], vocab: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    length = _EXAMPLE_SHAPE[1]
    mask = np.ones(_EXAMPLE_SHAPE, np.int64)
    mask[0, length // 2 :] = 0  # one padded row, so the check covers masking
    feeds = {
        "input_ids": rng.integers(0, min(vocab, 1000), _EXAMPLE_SHAPE).astype(np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros(_EXAMPLE_SHAPE, np.int64),
    }
    return {name: torch.from_numpy(feeds[name]) for name in names}


def _digests(folder: Path) -> list[str]:
    files = [folder / "config.json", *sorted(f for p in _WEIGHTS for f in folder.glob(p))]
    if len(files) == 1:
        raise UnknownModelError(f"{folder} has a config.json but no *.safetensors or *.bin weights")
    digests = []
    for file in files:
        with open(file, "rb") as f:
            digests.append(f"{file.name}:{hashlib.file_digest(f, 'sha256').hexdigest()}")
    return digests
