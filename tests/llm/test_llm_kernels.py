import pytest
import torch
from torch import nn

from turboinfer.llm.kernels import FastLinear, mkl_packing_available


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("batch_hint", [0, 16])
def test_fast_linear_equals_linear_at_every_row_count(bias: bool, batch_hint: int) -> None:
    if batch_hint and not mkl_packing_available():
        pytest.skip("torch built without MKL")
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias).requires_grad_(False)
    fast = FastLinear(linear, batch_hint)
    assert (fast.packed is not None) == bool(batch_hint)
    for rows in (1, 6, 16, 21):
        x = torch.randn(rows, 96)
        torch.testing.assert_close(fast(x), linear(x), atol=1e-5, rtol=1e-5)
    x3 = torch.randn(2, 5, 96)  # leading dimensions are kept
    torch.testing.assert_close(fast(x3), linear(x3), atol=1e-5, rtol=1e-5)
