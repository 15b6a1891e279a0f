"""The ``preprocess`` / ``postprocess`` / ``labels`` keys of a repository entry.

``config.yaml``::

    preprocess:
      - kind: image            # BYTES input holding JPEG / PNG / WebP files
        input: image           # the name requests send it under
        tensor: input          # the model input it fills (NCHW float)
        resize: 256            # shorter side, then a centre crop
        crop: 224
        mean: [0.485, 0.456, 0.406]   # of [0, 1] pixels, R, G, B
        std: [0.229, 0.224, 0.225]
        max_pixels: 40000000   # larger images are refused before they are decoded
      - kind: text             # BYTES input holding UTF-8 strings
        input: text
        tokenizer: tokenizer.json     # in the model folder (tokenizers' format)
        max_length: 128        # truncation; null: the tokenizer's own, else 512
    postprocess:
      - kind: topk             # BYTES [N, k] "score:index:label", softmax scores
        output: logits         # the model output it reads
        name: top5             # the output it adds
        k: 5
      - kind: argmax           # INT64 [N]
        output: logits
        name: class
      - kind: embedding        # FP32 [N, H]: mean-pooled over the mask, L2-normalized
        output: last_hidden_state
        name: embedding
        pool: mean             # none: the output is already [N, H]
        normalize: true
    labels: {logits: labels.txt}  # one label per line, for topk and the classification
                                  # extension (``parameters: {"classification": k}``)

File paths are relative to the model folder. The tensor inputs stay accepted beside the
raw ones: a request sends either the raw input or the model's own tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# 40 megapixels: any camera photo; a 20,000 x 20,000 image (1.2 GB as RGB) is refused.
MAX_PIXELS = 40_000_000
DEFAULT_MAX_LENGTH = 512  # BERT's positions, when neither config nor tokenizer says


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImagePreprocess(_Strict):
    kind: Literal["image"]
    input: str = "image"
    tensor: str = "input"
    resize: int = Field(default=256, ge=1, le=8192)
    crop: int = Field(default=224, ge=1, le=8192)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[Annotated[float, Field(gt=0)], ...] = IMAGENET_STD
    max_pixels: int = Field(default=MAX_PIXELS, ge=1)
    threads: int = Field(default=0, ge=0)  # decoder threads; 0: the usable cores

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.tensor,)


class TextPreprocess(_Strict):
    kind: Literal["text"]
    input: str = "text"
    tokenizer: str = "tokenizer.json"
    max_length: int | None = Field(default=None, ge=1)
    ids: str = "input_ids"
    mask: str = "attention_mask"
    type_ids: str = "token_type_ids"

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.ids, self.mask, self.type_ids)


Preprocess = Annotated[ImagePreprocess | TextPreprocess, Field(discriminator="kind")]


class Postprocess(_Strict):
    kind: Literal["topk", "argmax", "embedding"]
    output: str
    name: str
    k: int = Field(default=5, ge=1)
    pool: Literal["none", "mean"] = "none"
    normalize: bool = True
    mask: str = "attention_mask"  # pool mean: the request's input that marks real tokens


def resolve(base: Path, file: str) -> str:
    """``file`` relative to the model folder ``base`` (absolute paths stay)."""
    path = Path(file).expanduser()
    return str(path if path.is_absolute() else base / path)
