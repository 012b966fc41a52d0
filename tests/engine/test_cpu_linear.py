"""Linears with packed weights on a CPU (fp32 arithmetic): same products as F.linear, used by
the CPU engine in fp32 and in bf16."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import LLM
from engine.model.cpu_linear import HUGE_PAGE, PackedLinear, cpu_packing_available, huge_page_bytes, pack_linear_layers

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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_engine_packs_its_linears(tiny_qwen3_path, dtype):
    """fp32 and bf16 alike: arithmetic in fp32 over packed weights; a bf16 engine's weights
    are bf16 values (its panels bf16, half the bytes) and its KV cache is bf16."""
    runner = LLM(model=str(tiny_qwen3_path), device="cpu", dtype=dtype).engine.runner
    model = runner.model
    assert model.packed_lm_head is not None
    assert isinstance(model.layers[0].mlp.gate_up_proj, PackedLinear)
    assert model.norm.weight.dtype == torch.float32 and runner.kv_caches[0][0].dtype == getattr(torch, dtype)
    assert torch.equal(model.norm.weight, model.norm.weight.to(getattr(torch, dtype)).float())
    # The native panels lie back to back in one buffer aligned for 2 MiB pages, in the order a
    # forward reads them (each layer's q/k/v, o, gate/up, down, then the LM head).
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    if packed[0].panels is not None:
        assert {lin.panels.dtype for lin in packed} == {getattr(torch, dtype)}
        assert packed[-1] is model.packed_lm_head and packed[0] is model.layers[0].self_attn.qkv_proj
        assert packed[0].panels.data_ptr() % HUGE_PAGE == 0
        for a, b in zip(packed, packed[1:]):
            end = a.panels.data_ptr() + a.panels.numel() * a.panels.element_size()
            assert end <= b.panels.data_ptr() < end + 64 and b.panels.data_ptr() % 64 == 0


def test_huge_page_buffer_is_aligned_writable_and_zeroed():
    t = huge_page_bytes(3 * HUGE_PAGE + 20)
    assert t.data_ptr() % HUGE_PAGE == 0 and t.dtype == torch.uint8 and t.numel() == 3 * HUGE_PAGE + 20
    assert not t.any()
    f = t[:4 * 1000].view(torch.float32)
    f.fill_(2.0)
    assert f.sum().item() == 2.0 * f.numel()
