"""Where the native panels stop being the faster linear on this machine: the model's layer
linears at each row count, through both of a PackedLinear's paths (engine/model/cpu_linear.py).

A PackedLinear multiplies up to NATIVE_MAX_ROWS rows with kvscope's panels and more with oneDNN.
Where the two cross depends on the CPU: the panels stream the weights at the read bandwidth and
do fp32 FMAs on AVX2, oneDNN's blocked GEMM uses whatever the CPU has (AVX-512, and AMX tiles
for a bf16 engine's bf16 copy). `python -m explorer bench-linears` prints both for one model
and dtype, so the crossover in cpu_linear.py's table is measured on each CPU kind, not guessed.

Every layer's linears run back to back (q/k/v, o, gate/up, down: as a forward reads them, the
whole set far past the L3), so each pass reads its weights from DRAM, as a real step does.
"""
from __future__ import annotations

import statistics
import time

import torch

from engine import LLM
from engine.cpu_kernels import native, unavailable_reason, variants
from engine.model.cpu_linear import NATIVE_MAX_ROWS, PackedLinear

from explorer.machine import cpu_summary

ROWS = (1, 4, 16, 32, 64, 128, 256, 1024)


def kernel_variants_line() -> str:
    """Which build of kvscope's native kernels runs, and every build this CPU cannot run, with why."""
    kernels = native()
    running = f"kvscope kernels: {kernels.variant}" if kernels else f"kvscope kernels off ({unavailable_reason()})"
    missing = [f"{name} not here ({reason})" for name, reason in variants().items() if reason]
    return "; ".join([running, *missing])


def layer_linears(llm: LLM) -> list[PackedLinear]:
    """The packed linears of every decoder layer, in the order a forward reads them (the LM head
    is left out: a step multiplies only its sampled rows by it)."""
    return [m for m in llm.engine.runner.model.layers.modules() if isinstance(m, PackedLinear)]


def pass_seconds(linears: list[PackedLinear], rows: int, path: str, reps: int) -> float:
    """Median seconds of `reps` passes of `rows` fp32 rows through every linear by one path
    ('panels' or 'onednn'); one untimed pass first (oneDNN builds its primitive per shape)."""
    inputs = {n: torch.randn(rows, n) for n in {lin.in_features for lin in linears}}
    runs = []
    with torch.inference_mode():
        for i in range(reps + 1):
            t0 = time.perf_counter()
            for lin in linears:
                getattr(lin, f"{path}_linear")(inputs[lin.in_features])
            if i:
                runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def bench_linears(dtype: str = "float32", model: str | None = None, rows: tuple[int, ...] = ROWS,
                  reps: int = 5, out=print) -> dict:
    """Both paths at each row count, in ms per pass over the model's layer linears; returns the
    table and the first row count at which oneDNN was faster (None: never)."""
    llm = LLM(model=model, dtype=dtype)
    linears = layer_linears(llm)
    if not linears or linears[0].panels is None:
        raise RuntimeError("the native panels are off here (no native CPU kernels): nothing to compare")
    info = llm.engine.model_info
    weight_mb = sum(lin.panels.nbytes for lin in linears) / 1e6
    out(f"CPU {cpu_summary()}; torch CPU kernels: {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads; {kernel_variants_line()}")
    out(f"model {info['name']} ({dtype}): {len(linears)} layer linears, native {dtype} panels {weight_mb:.0f} MB, "
        f"oneDNN in {info['cpu_gemm_dtype']}; median of {reps} passes; the engine uses the panels up to "
        f"NATIVE_MAX_ROWS={NATIVE_MAX_ROWS} rows")
    out(f"{'rows':>6} {'panels ms':>10} {'oneDNN ms':>10}  faster")
    table = []
    for n in rows:
        panels, onednn = (pass_seconds(linears, n, path, reps) * 1e3 for path in ("panels", "onednn"))
        table.append({"rows": n, "panels_ms": panels, "onednn_ms": onednn})
        out(f"{n:>6} {panels:>10.1f} {onednn:>10.1f}  {'panels' if panels < onednn else 'oneDNN'}")
    onednn_from = next((r["rows"] for r in table if r["onednn_ms"] < r["panels_ms"]), None)
    out(f"oneDNN faster from {onednn_from} rows" if onednn_from else "the panels faster at every row count measured")
    return {"rows": table, "onednn_faster_from": onednn_from, "native_max_rows": NATIVE_MAX_ROWS,
            "cpu_gemm_dtype": info["cpu_gemm_dtype"], "dtype": dtype}
