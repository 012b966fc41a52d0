"""Where the native panels stop being the faster path on this machine: the model's layer
linears at each row count, through both of a PackedLinear's paths (engine/model/cpu_linear.py),
then whole decode steps at each batch size, as one native call and layer by layer on oneDNN.

A PackedLinear multiplies up to this machine's limit of rows with kvscope's panels and more
with oneDNN, and a pure-decode step up to its own limit runs as one native call
(engine/runner/native_decode.py): the engine measures both at first use and keeps them
(engine/runner/crossover.py). The layer-by-layer step also pays Python and oneDNN's per-call
costs, so the whole step crosses later than the linears alone. This bench prints the same
comparisons at more row counts, with the engine's own limits and where they came from.
Where the two cross depends on the CPU: the panels stream the weights at the read bandwidth and
do fp32 FMAs on AVX2, oneDNN's blocked GEMM uses whatever the CPU has (AVX-512, and AMX tiles
for a bf16 engine's bf16 copy). `python -m benchmarks bench-linears` prints both for one model
and dtype: the tables behind the engine's limits, at more row counts.

Every layer's linears run back to back (q/k/v, o, gate/up, down: as a forward reads them, the
whole set far past the L3), so each pass reads its weights from DRAM, as a real step does.
"""
from __future__ import annotations

import torch

from engine import LLM
from engine.cpu_kernels import native, unavailable_reason, variants_not_running
from engine.model.cpu_linear import PackedLinear
from engine.runner import crossover
from engine.runner.native_decode import why_no_native_decode
from explorer.apps.machine import cpu_summary

ROWS = (1, 4, 16, 32, 64, 128, 256, 1024)
STEP_ROWS = (16, 32, 64, 96, 128)


def kernel_variants_line() -> str:
    """Which build of kvscope's native kernels runs, and every build this CPU cannot run, with why."""
    kernels = native()
    running = f"kvscope kernels: {kernels.variant}" if kernels else f"kvscope kernels off ({unavailable_reason()})"
    return "; ".join([running, *variants_not_running()])


def layer_linears(llm: LLM) -> list[PackedLinear]:
    """The packed linears of every decoder layer, in the order a forward reads them (the LM head
    is left out: a step multiplies only its sampled rows by it)."""
    return [m for m in llm.engine.runner.model.layers.modules() if isinstance(m, PackedLinear)]


def bench_linears(dtype: str = "float32", model: str | None = None, rows: tuple[int, ...] = ROWS,
                  reps: int = 5, step_rows: tuple[int, ...] = STEP_ROWS, out=print) -> dict:
    """Both paths at each row count, in ms per pass over the model's layer linears, then whole
    decode steps both ways at each of `step_rows` (none: skipped): the engine's own measurements
    (crossover.measure_linears, measure_steps), best of `reps`, at every row count asked for.
    Returns both tables and the first row count at which oneDNN was faster in each (None: never)."""
    llm = LLM(model=model, dtype=dtype)
    linears = layer_linears(llm)
    if not linears or linears[0].panels is None:
        raise RuntimeError("the native panels are off here (no native CPU kernels): nothing to compare")
    info = llm.engine.model_info
    weight_mb = sum(lin.panels.nbytes for lin in linears) / 1e6
    out(f"CPU {cpu_summary()}; torch CPU kernels: {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads; {kernel_variants_line()}")
    out(f"model {info['name']} ({dtype}): {len(linears)} layer linears, native {dtype} panels {weight_mb:.0f} MB, "
        f"oneDNN in {info['cpu_gemm_dtype']}; best of {reps} passes")
    out(f"the engine here: {info['native_rows_source']}")
    out(f"{'rows':>6} {'panels ms':>10} {'oneDNN ms':>10}  faster")
    table = []
    for n, panels, onednn in crossover.measure_linears(linears, rows, reps, every_row=True):
        table.append({"rows": n, "panels_ms": panels, "onednn_ms": onednn})
        out(f"{n:>6} {panels:>10.1f} {onednn:>10.1f}  {'panels' if panels < onednn else 'oneDNN'}")
    onednn_from = next((r["rows"] for r in table if r["onednn_ms"] < r["panels_ms"]), None)
    out(f"oneDNN faster from {onednn_from} rows" if onednn_from else "the panels faster at every row count measured")
    steps = step_crossover(llm, step_rows, reps, out) if step_rows else []
    step_from = next((r["rows"] for r in steps if r["layer_by_layer_ms"] < r["native_ms"]), None)
    return {"rows": table, "onednn_faster_from": onednn_from, "native_linear_rows": info["native_linear_rows"],
            "native_decode_rows": info["native_decode"], "native_rows_source": info["native_rows_source"],
            "steps": steps, "layer_by_layer_faster_from": step_from,
            "cpu_gemm_dtype": info["cpu_gemm_dtype"], "dtype": dtype}


def step_crossover(llm: LLM, step_rows: tuple[int, ...], reps: int, out=print) -> list[dict]:
    """Whole pure-decode steps of each batch size in `step_rows`, as one native call and layer by
    layer with every linear on oneDNN (crossover.measure_steps: the forward to the logits, through
    a throwaway KV pool), wherever the native decode can run, also where this machine's measured
    limit turned it off (that measurement is what this table shows again)."""
    eng = llm.engine
    runner = eng.runner
    cannot = why_no_native_decode(eng.config.enforce_eager, runner.device, runner.dtype, runner.backend.name,
                                  runner.tp.size, runner.model)
    if cannot is not None:
        out(f"whole steps: no native decode here ({cannot})")
        return []
    out(f"whole decode steps, best of {reps}:")
    out(f"{'rows':>6} {'native ms':>10} {'layer-by-layer oneDNN ms':>25}  faster")
    table = []
    for n, native_ms, layer_ms in crossover.measure_steps(runner, crossover.packed_linears(runner), step_rows, reps,
                                                          every_row=True):
        table.append({"rows": n, "native_ms": native_ms, "layer_by_layer_ms": layer_ms})
        out(f"{n:>6} {native_ms:>10.1f} {layer_ms:>25.1f}  {'native' if native_ms <= layer_ms else 'layer by layer'}")
    return table
