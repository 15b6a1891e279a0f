"""Shape flags: one meaning (the batch axis excluded when the model has one), checked
against the model's inputs with one-line errors."""

from __future__ import annotations

import pytest

from turboinfer.errors import InvalidInputError
from turboinfer.shapes import (
    DeclaredInput,
    concrete_shape,
    fixed_batch,
    parse_shape_flag,
    resolve_shapes,
)

IMAGE = DeclaredInput("image", (None, 3, None, None))
FIXED = DeclaredInput("image", (1, 3, 8, 8))


def test_parse_shape_flag() -> None:
    assert parse_shape_flag("image=3x224X224") == ("image", (3, 224, 224))
    assert parse_shape_flag("input:0=16") == ("input:0", (16,))  # names may hold a colon
    for bad in ("image", "=3", "image=", "image=3xa"):
        with pytest.raises(ValueError, match="NAME=D1xD2"):
            parse_shape_flag(bad)


def test_the_batch_axis_comes_from_the_batch_size() -> None:
    shapes = resolve_shapes([("image", (3, 32, 48))], [IMAGE], model="m")
    assert concrete_shape(IMAGE, 4, shapes) == (4, 3, 32, 48)
    assert concrete_shape(IMAGE, 1, {}, dynamic_size=128) == (1, 3, 128, 128)


def test_a_model_without_batch_axis_takes_the_whole_shape() -> None:
    assert resolve_shapes([("image", (1, 3, 8, 8))], [FIXED], model="m") == {
        "image": (1, 3, 8, 8)}
    assert concrete_shape(FIXED, 1, {}) == (1, 3, 8, 8)
    assert fixed_batch([FIXED]) == 1 and fixed_batch([IMAGE, FIXED]) is None


@pytest.mark.parametrize(("flag", "problem"), [
    (("picture", (3, 8, 8)), "no input is named 'picture'"),
    (("image", (1, 3, 8, 8)), "input 'image' has 3 axes besides the batch axis, 4 given"),
    (("image", (3, 0, 8)), "sizes of input 'image' must be >= 1"),
    (("image", (4, 8, 8)), "input 'image' has a fixed size 3 where 4 is given"),
])
def test_bad_flags_name_the_input_and_the_model_inputs(
        flag: tuple[str, tuple[int, ...]], problem: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        resolve_shapes([flag], [IMAGE], model="m")
    text = "x".join(map(str, flag[1]))
    assert str(info.value) == (f"--shape {flag[0]}={text}: {problem}; model 'm' takes "
                               f"'image' [batch, 3, ?, ?] (shapes exclude the batch axis)")


def test_a_dynamic_axis_without_a_size_names_the_flag() -> None:
    with pytest.raises(InvalidInputError, match=r"--shape image=D1xD2\.\.\. \(without"):
        concrete_shape(IMAGE, 1, {})
