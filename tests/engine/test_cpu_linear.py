"""fp32 linears through oneDNN with packed weights: same products as F.linear, used by the
CPU engine in fp32 only."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import LLM
from engine.model.cpu_linear import PackedLinear, cpu_packing_available, pack_linear_layers

pytestmark = pytest.mark.skipif(not cpu_packing_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 16, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 40, generator=g), torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 40, generator=g)
    torch.testing.assert_close(PackedLinear(w, b)(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(PackedLinear(w, b)(x[:, ::1].t().contiguous().t()), F.linear(x, w, b),
                               rtol=1e-5, atol=1e-5)  # a non-contiguous input too


def test_pack_replaces_plain_linears_only():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 2, bias=False)))
    x = torch.randn(5, 4)
    want = model(x)
    assert pack_linear_layers(model) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)


def test_cpu_engine_packs_in_fp32_not_in_bf16(tiny_qwen3_path):
    fp32 = LLM(model=str(tiny_qwen3_path), device="cpu").engine.runner.model
    assert fp32.packed_lm_head is not None
    assert isinstance(fp32.layers[0].mlp.gate_up_proj, PackedLinear)
    bf16 = LLM(model=str(tiny_qwen3_path), device="cpu", dtype="bfloat16").engine.runner.model
    assert bf16.packed_lm_head is None and isinstance(bf16.layers[0].mlp.gate_up_proj, nn.Linear)
