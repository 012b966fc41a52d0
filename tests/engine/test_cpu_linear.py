"""fp32 linears through oneDNN with packed weights: same products as F.linear, used by the
CPU engine in fp32 only."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import LLM
from engine.model.cpu_linear import HUGE_PAGE, PackedLinear, cpu_packing_available, huge_page_floats, pack_linear_layers

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
    # The native panels lie back to back in one buffer aligned for 2 MiB pages, in the order a
    # forward reads them (each layer's q/k/v, o, gate/up, down, then the LM head).
    packed = [m for m in fp32.modules() if isinstance(m, PackedLinear)]
    if packed[0].panels is not None:
        assert packed[-1] is fp32.packed_lm_head and packed[0] is fp32.layers[0].self_attn.qkv_proj
        assert packed[0].panels.data_ptr() % HUGE_PAGE == 0
        for a, b in zip(packed, packed[1:]):
            assert b.panels.data_ptr() == a.panels.data_ptr() + a.panels.numel() * 4


def test_huge_page_buffer_is_aligned_writable_and_zeroed():
    t = huge_page_floats(3 * HUGE_PAGE // 4 + 5)
    assert t.data_ptr() % HUGE_PAGE == 0 and t.dtype == torch.float32 and not t.any()
    t.fill_(2.0)
    assert t.sum().item() == 2.0 * t.numel()
