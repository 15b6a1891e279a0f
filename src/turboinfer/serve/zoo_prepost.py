"""What the built-in models take and give besides tensors, when served from the zoo.

``resnet18`` / ``resnet50`` take JPEG, PNG or WebP bytes as input ``image`` (ImageNet's
preparation: shorter side 256, centre crop 224, ImageNet mean and std) and answer
``top5`` (softmax scores with ImageNet's class names) beside ``logits``; ``minilm``
takes strings as input ``text``, tokenized with its own ``tokenizer.json``. Their tensor
inputs stay accepted. The class names are ImageNet's 1000 (the index order of
torchvision's and Keras' pretrained models), from pytorch/hub's ``imagenet_classes.txt``;
with the zoo's random weights the names say nothing about the image, only which index.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from turboinfer.serve.config import ModelConfig
from turboinfer.serve.prepost_config import ImagePreprocess, Postprocess, TextPreprocess


def imagenet_labels() -> str:
    return str(resources.files("turboinfer.models").joinpath("data/imagenet_labels.txt"))


def _image_classifier(config: ModelConfig) -> ModelConfig:
    return config.model_copy(update={
        "preprocess": (ImagePreprocess(kind="image", input="image", tensor="input"),),
        "postprocess": (Postprocess(kind="topk", output="logits", name="top5", k=5),),
        "labels": {"logits": imagenet_labels()},
    })


def _sentence_encoder(config: ModelConfig) -> ModelConfig:
    from turboinfer.models.minilm import MAX_LENGTH, model_dir  # imports torch: on use

    tokenizer = str(model_dir() / "tokenizer.json")
    return config.model_copy(update={"preprocess": (
        TextPreprocess(kind="text", input="text", tokenizer=tokenizer, max_length=MAX_LENGTH),)})


_TABLE: dict[str, Callable[[ModelConfig], ModelConfig]] = {
    "resnet18": _image_classifier,
    "resnet50": _image_classifier,
    "minilm": _sentence_encoder,
}


def with_prepost(name: str, config: ModelConfig) -> ModelConfig:
    """``config`` with the zoo model's pre- and post-processing, if it has any."""
    add = _TABLE.get(name)
    return add(config) if add is not None else config
