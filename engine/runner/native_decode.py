"""Decode steps on a CPU as one native call: the CPU's counterpart of CUDA graphs.

A decode step of a few rows is bound by streaming the weights from memory, and kvscope's native
linears do that at the machine's read bandwidth. What else the step costs is overhead: from
Python each layer runs about ten small operations, each with its own dispatch, allocation and
thread wake-up (~13 ms of a 58 ms one-stream step on the 2-core AMD EPYC, the linears ~40 ms).
Here a pure-decode step runs the whole model (embedding, every layer, final norm, LM head) as
one call into engine/cpu_kernels (kv_decode_forward), in one parallel region, through the same
kernel bodies as the layer-by-layer path: the same arithmetic in the same order, so the same
bits. The runner's prepare writes a step's token ids, positions, slots and block tables from
its lists into the call's own arrays, so nothing between two calls builds a tensor.

Like CUDA graphs it covers only what it can: steps whose every row is a one-token decode, at
most this machine's crossover of them (measured at first use, crossover.py: above it, oneDNN's GEMM
layer by layer is the faster step); prefills, mixed
steps, attention probes and larger batches run layer by layer. The StepRecord's
`timings_ms.forward_path` says which ran ('native_decode' or 'eager'), and model_info's
`native_decode_off` says why it is off where it is."""
from __future__ import annotations

import ctypes

import torch
from torch import nn

from ..cpu_kernels import DecodeBatchPointers, DecoderLayerPointers, DecoderPointers, NativeCpuKernels, native
from ..dtypes import dtype_name
from ..model import CausalLM
from ..model.cpu_linear import PackedLinear, rounding_for
from ..model.decoder import DecoderLayer

BACKEND = "cpu"  # the attention backend whose decodes (and K/V layout) the native call reproduces


def why_no_native_decode(enforce_eager: bool, device: torch.device, dtype: torch.dtype, backend_name: str,
                         tp_size: int, model: CausalLM) -> str | None:
    """None when decode steps can run as one native call here, else why they run layer by layer."""
    if enforce_eager:
        return "enforce_eager=True"
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return f"{device.type} in {dtype_name(dtype)}: the native decode is for a CPU in float32 or bfloat16"
    if native() is None:
        return "kvscope's native CPU kernels are off here"
    if backend_name != BACKEND:
        return f"attention backend {backend_name!r}: the native decode is the {BACKEND!r} backend's"
    if tp_size > 1:
        return "tensor parallel: each layer's all-reduce runs between the native calls"
    if model.spec.head_dim % 8:
        return f"head_dim {model.spec.head_dim} is not a multiple of 8 (the attention kernel's vector width)"
    head, linears = model.packed_lm_head, _linears(model)
    if head is None or not all(isinstance(lin, PackedLinear) and lin.panels is not None and lin.panels.dtype == dtype
                               for lin in [*linears, head]):
        return f"the linears are not packed in native {dtype_name(dtype)} panels"
    if {lin.rounding for lin in linears if isinstance(lin, PackedLinear)} != {rounding_for(dtype)} \
            or head.rounding != rounding_for(dtype, lm_head=True):
        return f"the linears do not round as a {dtype_name(dtype)} engine's do (kv_decode_forward's round_bf16)"
    return None


class NativeDecode:
    """Runs a pure-decode step of up to `max_rows` rows (this machine's crossover, crossover.py) as
    one kv_decode_forward call. Built once per runner: the weight and KV-pool addresses are
    fixed, only the batch changes."""

    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                 max_model_len: int, max_rows: int) -> None:
        kernels, head = native(), model.packed_lm_head
        if kernels is None or head is None:  # why_no_native_decode says so first
            raise RuntimeError("the native decode needs kvscope's native kernels and a packed LM head")
        self.kernels: NativeCpuKernels = kernels
        self.max_rows = max_rows
        spec = model.spec
        layers = model.decoder_layers()
        rope = layers[0].self_attn.rope
        window = spec.sliding_window or 0
        self._layers = (DecoderLayerPointers * len(layers))(*(
            _layer_pointers(layer, k, v, window) for layer, (k, v) in zip(layers, kv_caches)))
        self._decoder = DecoderPointers(
            num_layers=spec.num_layers, hidden=spec.hidden_size, heads=spec.num_heads, kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim, intermediate=spec.intermediate_size, block_size=block_size,
            vocab=spec.vocab_size, bf16=int(kv_caches[0][0].dtype == torch.bfloat16),  # the panels too
            # Rounds where the layer-by-layer path's PackedLinears do (the same bits).
            round_bf16=int(head.rounding != 0),
            eps=spec.rms_norm_eps, attn_scale=spec.head_dim ** -0.5,
            embedding=_ptr(model.embed_tokens.weight), final_norm=_ptr(model.norm.weight),
            lm_head_panels=_panels(head), cos_table=_ptr(rope.cos), sin_table=_ptr(rope.sin),
            layers=self._layers)
        # Workspaces for the largest batch; a step uses their first rows.
        rows, q_size = self.max_rows, spec.num_heads * spec.head_dim
        widths = {"x": spec.hidden_size, "residual": spec.hidden_size, "normed": spec.hidden_size,
                  "qkv": q_size + 2 * spec.num_kv_heads * spec.head_dim, "attn": q_size,
                  "gate_up": 2 * spec.intermediate_size, "act": spec.intermediate_size, "logits": spec.vocab_size}
        self._work = {name: torch.empty((rows, width), dtype=torch.float32) for name, width in widths.items()}
        # The step's inputs, written in place from the Batch's lists through ctypes (load): no
        # torch call between two steps' native calls, where each costs ~40 us with the caches
        # just flushed by the weights' stream (on the 2-core AMD EPYC).
        self.max_blocks = -(-max_model_len // block_size)
        # A model with sliding-window layers: their group's slots and tables beside the full group's.
        self._inputs = {name: torch.zeros(n, dtype=torch.int64) for name, n in (
            ("token_ids", rows), ("positions", rows), ("slots", rows), ("seq_lens", rows),
            ("decode_rows", rows), ("block_tables", rows * self.max_blocks),
            ("group_slots", rows), ("group_block_tables", rows * self.max_blocks))}
        self._inputs["decode_rows"].copy_(torch.arange(rows))  # a pure-decode step: row i is decode i
        self._arrays = {name: (ctypes.c_int64 * t.numel()).from_address(t.data_ptr())
                        for name, t in self._inputs.items()}
        self._batch = DecodeBatchPointers(**{name: _ptr(t)
                                             for name, t in (*self._work.items(), *self._inputs.items())})
        self._logits = [self._work["logits"][:n] for n in range(rows + 1)]  # one view per row count
        self._model = model  # keeps the weights (and so the addresses above) alive

    def takes(self, num_tokens: int, num_decodes: int, num_sampled: int, *group_tables: list[list[int]]) -> bool:
        """A pure-decode step (every row a one-token decode that samples) of at most max_rows
        rows whose block tables, in each KV cache group, fit the input arrays."""
        return (num_decodes == num_tokens == num_sampled <= self.max_rows
                and all(max(map(len, tables)) <= self.max_blocks for tables in group_tables))

    def load(self, token_ids: list[int], positions: list[int], slots: list[int], seq_lens: list[int],
             block_tables: list[list[int]], group_slots: list[int] | None = None,
             group_block_tables: list[list[int]] | None = None) -> None:
        """Writes a step that `takes` accepted (one entry per decode) into the call's arrays, with
        the sliding-window group's slots and tables where the model has that group."""
        n, a = len(token_ids), self._arrays
        # mypy's ctypes plugin wants a list[c_int64 | int] in a slice of a c_int64 array; ctypes takes
        # any iterable of ints, and a list[int] is what the Batch holds (converting would cost).
        a["token_ids"][:n] = token_ids  # type: ignore[assignment]
        a["positions"][:n] = positions  # type: ignore[assignment]
        a["slots"][:n] = slots  # type: ignore[assignment]
        a["seq_lens"][:n] = seq_lens  # type: ignore[assignment]
        self._batch.rows, self._batch.table_stride = n, self._load_tables("block_tables", block_tables)
        if group_slots is not None and group_block_tables is not None:
            a["group_slots"][:n] = group_slots  # type: ignore[assignment]
            self._batch.group_table_stride = self._load_tables("group_block_tables", group_block_tables)

    def _load_tables(self, name: str, block_tables: list[list[int]]) -> int:
        """Writes one group's tables into its array, a row per decode; returns the row stride."""
        width, tables = max(map(len, block_tables)), self._arrays[name]
        for i, table in enumerate(block_tables):
            tables[i * width: i * width + len(table)] = table  # type: ignore[assignment]
        return width

    def run(self) -> torch.Tensor:
        """The loaded step's logits [rows, vocab] (fp32), as CausalLM.compute_logits returns
        them: a view of a workspace that the next run overwrites."""
        self.kernels.decode_forward(self._decoder, self._batch)
        return self._logits[self._batch.rows]


def _layer_pointers(layer: DecoderLayer, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    window: int) -> DecoderLayerPointers:
    """A layer's weights and KV pools, and its KV cache group: a sliding-window layer (group 1)
    reads that group's tables and attends to the last `window` positions."""
    attn, mlp = layer.self_attn, layer.mlp
    return DecoderLayerPointers(
        input_norm=_ptr(layer.input_layernorm.weight), post_attention_norm=_ptr(layer.post_attention_layernorm.weight),
        qkv_panels=_panels(attn.qkv_proj), qkv_bias=_ptr(attn.qkv_proj.bias),
        q_norm=_ptr(attn.q_norm.weight if attn.q_norm is not None else None),
        k_norm=_ptr(attn.k_norm.weight if attn.k_norm is not None else None),
        o_panels=_panels(attn.o_proj), gate_up_panels=_panels(mlp.gate_up_proj),
        down_panels=_panels(mlp.down_proj), k_cache=_ptr(k_cache), v_cache=_ptr(v_cache),
        group=attn.kv_group, window=window if attn.kv_group else 0)


def _linears(model: CausalLM) -> list[nn.Module]:
    """Every layer's four linears (PackedLinears once pack_for_cpu swapped them in)."""
    return [m for layer in model.decoder_layers()
            for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]


def _panels(linear: nn.Module) -> int | None:
    """The address of a packed linear's native panels (why_no_native_decode checked they exist)."""
    if not isinstance(linear, PackedLinear) or linear.panels is None:
        raise RuntimeError(f"{type(linear).__name__} has no native panels: the native decode cannot run this model")
    return _ptr(linear.panels)


def _ptr(t: torch.Tensor | None) -> int | None:
    """The address the C side reads; the tensors must be contiguous (fp32 activations and norms,
    fp32 or bf16 panels and caches, int64 indices)."""
    if t is None:
        return None
    assert t.is_contiguous(), "the native decode reads contiguous tensors"
    return t.data_ptr()
