"""The built-in zoo: importing this module registers every entry in ``ZOO``."""

from __future__ import annotations

from turboinfer.models import digits, minilm, resnet
from turboinfer.models.zoo import register

for _entry in (digits.ENTRY, resnet.RESNET18, resnet.RESNET50, minilm.ENTRY):
    register(_entry)
