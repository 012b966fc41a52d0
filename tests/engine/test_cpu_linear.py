"""Linears with packed weights on a CPU (fp32 arithmetic): same products as F.linear, used by
the CPU engine in fp32 and in bf16."""
from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import LLM
from engine.cpu_kernels import ROUND_INPUT, ROUND_OUTPUT
from engine.model.cpu_linear import (
    HUGE_PAGE,
    UNMEASURED_MAX_ROWS,
    PackedLinear,
    cpu_packing_available,
    gemm_dtype_for,
    huge_page_bytes,
    onednn_runs_bf16,
    pack_linear_layers,
    rounding_for,
)
from engine.model.logits_head import LogitsHead

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


@pytest.mark.parametrize("panel_dtype", [torch.float32, torch.bfloat16])
def test_logits_head_reuses_one_workspace_and_gives_the_heads_product(panel_dtype):
    """The head's logits: the product of the rows (rounded to bf16 values in a bf16 engine) by
    the weight, on the panels for few rows and the GEMM for many, in one workspace that grows to
    the most rows asked for and is reused after (a fresh 100+ MB tensor a step was mapped and
    unmapped each time: logits_head.py)."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(1000, 48, generator=g).to(panel_dtype).float()
    head = LogitsHead(w, panel_dtype)
    rounded = (lambda x: x.bfloat16().float()) if panel_dtype == torch.bfloat16 else (lambda x: x)
    addresses = []
    for rows in (3, UNMEASURED_MAX_ROWS + 40, 5, UNMEASURED_MAX_ROWS + 40):
        x = torch.randn(rows, 48, generator=g)
        got = head(x)
        torch.testing.assert_close(got, rounded(x) @ w.t(), rtol=1e-5, atol=1e-5)
        addresses.append(got.data_ptr())
    assert addresses[1] == addresses[2] == addresses[3] and head.packed_weight is None


def _bf16_linear_case(bias: bool):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(96, 64, generator=g).bfloat16().float()  # a bf16 engine's weights: bf16 values
    b = torch.randn(96, generator=g).bfloat16().float() if bias else None
    return w, b, torch.randn(UNMEASURED_MAX_ROWS + 36, 64, generator=g)


def _assert_rounds_like_a_bf16_layer(lin: PackedLinear, w, b, x):
    """Both of a bf16 layer linear's paths take the rows as bf16 values and give bf16 values:
    each within one bf16 rounding of the exact product of the rounded rows, and the two paths
    one rounding apart at most (their fp32 sums differ only in order)."""
    exact = F.linear(x.bfloat16().double(), w.double(), None if b is None else b.double()).float()
    paths = {"onednn": lin.onednn_linear(x)}
    if lin.panels is not None:
        paths["panels"] = lin.panels_linear(x)
    for y in paths.values():
        assert y.dtype == torch.float32 and torch.equal(y, y.bfloat16().float())
        torch.testing.assert_close(y, exact, rtol=2 ** -8, atol=1e-6)
    if "panels" in paths:
        torch.testing.assert_close(paths["panels"], paths["onednn"], rtol=2 ** -7, atol=1e-6)
        assert (paths["panels"] == paths["onednn"]).float().mean() > 0.99  # one rounding apart, rarely


@pytest.mark.skipif(not onednn_runs_bf16(), reason="oneDNN multiplies bf16 in hardware only with AMX or AVX512_BF16")
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_gemm_rounds_rows_and_outputs_where_the_panels_do(bias):
    """Where the CPU multiplies bf16, a bf16 layer linear's oneDNN copy is bf16: bf16 rows in,
    bf16 out, as the native panels round them (cpu_linear.py's module doc)."""
    w, b, x = _bf16_linear_case(bias)
    lin = PackedLinear(w, b, torch.bfloat16, torch.bfloat16, ROUND_INPUT | ROUND_OUTPUT)
    assert lin.packed_weight.dtype == torch.bfloat16
    _assert_rounds_like_a_bf16_layer(lin, w, b, x)


@pytest.mark.parametrize("bias", [False, True])
def test_fp32_gemm_copy_rounds_around_itself_in_a_bf16_engine(bias):
    """On every CPU kind (AVX2 refuses bf16 packing), an fp32 oneDNN copy of a bf16 layer
    linear gets the same rounding done around it; the LM head rounds its input only."""
    w, b, x = _bf16_linear_case(bias)
    lin = PackedLinear(w, b, torch.bfloat16, torch.float32, rounding_for(torch.bfloat16))
    _assert_rounds_like_a_bf16_layer(lin, w, b, x)
    head = PackedLinear(w, None, torch.bfloat16, torch.float32, rounding_for(torch.bfloat16, lm_head=True))
    torch.testing.assert_close(head.onednn_linear(x), F.linear(x.bfloat16().float(), w), rtol=1e-5, atol=1e-5)
    assert not torch.equal(head.onednn_linear(x), head.onednn_linear(x).bfloat16().float())  # fp32 logits
    with pytest.raises(ValueError, match="rounding must say both"):
        PackedLinear(w, b, torch.bfloat16, torch.bfloat16, ROUND_INPUT)


def test_bf16_engine_packs_onednn_in_bf16_only_where_the_cpu_multiplies_bf16(tiny_qwen3_path):
    """gemm_dtype_for: fp32 engines always fp32; bf16 engines bf16 exactly where oneDNN runs it
    in hardware (AMX / AVX512_BF16), else fp32 (AVX2 refuses bf16 packing). model_info says which."""
    assert gemm_dtype_for(torch.float32) == torch.float32
    want = torch.bfloat16 if onednn_runs_bf16() else torch.float32
    assert gemm_dtype_for(torch.bfloat16) == want
    engine = LLM(model=str(tiny_qwen3_path), device="cpu", dtype="bfloat16").engine
    model = engine.runner.model
    packed = [m for m in model.layers.modules() if isinstance(m, PackedLinear)]
    assert {lin.packed_weight.dtype for lin in packed} == {want} and {lin.gemm_dtype for lin in packed} == {want}
    assert {lin.rounding for lin in packed} == {ROUND_INPUT | ROUND_OUTPUT}
    # The head gives fp32 logits: its many-row GEMM reads an fp32 copy, its input rounded only.
    head = model.packed_lm_head
    assert (head.packed_weight, head.weight_t.dtype, head.rounding) == (None, torch.float32, ROUND_INPUT)
    assert engine.model_info["cpu_gemm_dtype"] == str(want).removeprefix("torch.")
    assert LLM(model=str(tiny_qwen3_path), device="cpu", dtype="float32").engine.model_info["cpu_gemm_dtype"] \
        == "float32"


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
        for a, b in pairwise(packed):
            end = a.panels.data_ptr() + a.panels.numel() * a.panels.element_size()
            assert end <= b.panels.data_ptr() < end + 64 and b.panels.data_ptr() % 64 == 0


def test_huge_page_buffer_is_aligned_writable_and_zeroed():
    t = huge_page_bytes(3 * HUGE_PAGE + 20)
    assert t.data_ptr() % HUGE_PAGE == 0 and t.dtype == torch.uint8 and t.numel() == 3 * HUGE_PAGE + 20
    assert not t.any()
    f = t[:4 * 1000].view(torch.float32)
    f.fill_(2.0)
    assert f.sum().item() == 2.0 * f.numel()
