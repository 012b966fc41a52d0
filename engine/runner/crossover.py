"""Where this machine's native panels stop being faster than oneDNN: measured once per CPU,
kernel build, model shape and dtype, kept in kvscope's cache folder beside the converted model,
and taken by the runner at load.

A CPU linear of a few rows streams the weights (kvscope's panels do that at the read bandwidth),
one of many rows is bound by arithmetic (oneDNN's blocked GEMM uses AVX-512 FMAs, AVX512_BF16
dot products or AMX tiles). Where the two cross depends on the CPU and the dtype far more than
on anything else: on the AMD EPYC kinds measured so far the panels win up to 64 rows in both
dtypes, on an Intel Xeon with AMX oneDNN's bf16 tiles win from 16 (docs/performance.md). So two
limits are measured, not assumed:

- `linear_max_rows`: a PackedLinear takes the panels up to this many rows (prefill chunks and
  mixed steps run layer by layer, each linear on its own): the model's layer linears timed
  both ways at each row count.
- `decode_max_rows`: a pure-decode step of up to this many rows runs as one native call
  (native_decode.py): whole steps timed both ways, the native call against the layer-by-layer
  forward with every linear on oneDNN, through a throwaway KV pool. The native call also saves
  Python's per-layer costs, so it crosses later than the linears alone.

Each limit is the last row count before the first at which the panels are clearly slower
(CLEAR_LOSS: closer than that is the machine's noise, and the panels keep it). The measurement
takes a few seconds for the default model and is done once: `crossover.json` in the cache
folder keeps it under a key naming the CPU (its model name and the flags the paths depend on),
the thread count, the kernel build, torch's version, the dtype and the model's shapes.
KVSCOPE_NATIVE_MAX_ROWS sets the limits instead ("N" for both, "LINEAR,DECODE" for each).

A measurement taken while other processes (or other virtual machines: steal time) kept the CPUs
busy, BUSY_CPUS on average or more, is used by that engine only, never kept: the native kernels'
OpenMP threads suffer far more than oneDNN's from a shared core (a 2-core run beside a test
suite measured the panels 3x slower at one row and turned them off), and a kept entry would
rule every later engine."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import torch

from ..attention import AttentionBackend, AttentionMetadata
from ..cpu_kernels import cpu_flags, native
from ..default_model import cache_dir
from ..dtypes import dtype_name
from ..model import CausalLM, ModelSpec
from ..model.cpu_linear import PackedLinear
from ..parallel.parallel_state import TensorParallel
from .batch import Batch
from .native_decode import NativeDecode

ENV_VAR = "KVSCOPE_NATIVE_MAX_ROWS"
CACHE_FILE = "crossover.json"
LINEAR_ROWS = (1, 4, 8, 16, 24, 32, 48, 64, 96, 128)
STEP_ROWS = (1, 4, 8, 16, 32, 48, 64, 96, 128)
# The panels give a row count up only where they are slower than this factor times the other
# path: repeated passes on a shared 2-core host differ by a few percent.
CLEAR_LOSS = 1.05
REPS = 2
BUSY_CPUS = 0.5    # others' CPU use during a measurement from which it is not kept (see the module doc)
# The flags whose presence moves the crossover: the panels' build and oneDNN's arithmetic.
CROSSOVER_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
STEP_CONTEXT = 32  # tokens each measured decode reads: attention is a small, equal part of either step

Table = tuple[tuple[int, float, float], ...]  # (rows, panels or native ms, oneDNN or layer-by-layer ms)


class MeasuredRunner(Protocol):
    """What the measurement reads of the runner (model_runner.ModelRunner, which imports this
    module to measure itself at load)."""

    spec: ModelSpec
    model: CausalLM
    dtype: torch.dtype
    tp: TensorParallel
    block_size: int
    backend: AttentionBackend
    native_decode_off_reason: str | None
    kv_groups: list[list[int]]   # the layers of each KV cache group

    def metadata(self, batch: Batch, ctx_lens: list[int], decode_ids: list[int]) -> AttentionMetadata: ...


@dataclass(frozen=True)
class Crossover:
    """This machine's limits for one model and dtype, and where they came from."""

    linear_max_rows: int
    decode_max_rows: int        # 0: the native decode is slower at every batch size measured
    source: str                 # 'measured' (now), 'busy' (now, not kept), 'cached' (earlier), or ENV_VAR
    key: str
    measured_at: str = ""       # ISO time of the measurement ('' for a setting)
    seconds: float = 0.0        # what the measurement took
    linears: Table = field(default=())
    steps: Table = field(default=())

    def describe(self) -> str:
        """One line: the limits and their origin (doctor, bench-linears, model_info)."""
        when = f"{self.measured_at[:16].replace('T', ' ')} UTC in {self.seconds:.1f} s"
        origin = {ENV_VAR: f"set by {ENV_VAR}", "measured": f"measured on this CPU at load, {when}",
                  "busy": f"measured on this CPU at load, {when}, while it was busy: not kept, the next engine "
                          "measures again",
                  "cached": f"measured on this CPU {when}, kept in {cache_path()}"}[self.source]
        return (f"native panels up to {self.linear_max_rows} rows per linear and {self.decode_max_rows} "
                f"per decode step ({origin})")


def limit_from(table: Table, clear_loss: float = CLEAR_LOSS) -> int:
    """The last row count before the first at which the panels (or the native call) take more
    than `clear_loss` times the other path; the last one measured if they never do; 0 if they
    lose at the first."""
    limit = 0
    for rows, ours, theirs in table:
        if ours > clear_loss * theirs:
            return limit
        limit = rows
    return limit


def setting() -> tuple[int, int] | None:
    """The limits KVSCOPE_NATIVE_MAX_ROWS sets (linear, decode), None if it is unset."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    parts = [p.strip() for p in raw.split(",")]
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise ValueError(f"{ENV_VAR} must be a row count N (both limits) or LINEAR,DECODE (each >= 0), "
                         f"got {raw!r}")
    linear, decode = int(parts[0]), int(parts[-1])
    return linear, decode


def cpu_key() -> str:
    """The CPU as far as the crossover cares: its model name, the flags the paths depend on and
    the threads torch runs on."""
    name = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags()
    return f"{name} [{' '.join(f for f in CROSSOVER_FLAGS if f in flags)}] x{torch.get_num_threads()}"


def crossover_key(runner: MeasuredRunner) -> str:
    s, kernels = runner.spec, native()
    shard = f"/tp{runner.tp.size}" if runner.tp.size > 1 else ""
    return (f"{cpu_key()} | kernels {kernels.variant if kernels else 'off'} | torch {torch.__version__} | "
            f"{dtype_name(runner.dtype)} | {s.num_layers}x(h{s.hidden_size} i{s.intermediate_size} "
            f"q{s.num_heads} kv{s.num_kv_heads} d{s.head_dim}) v{s.vocab_size}{shard}")


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def load_cached(key: str, path: Path | None = None) -> Crossover | None:
    """The measurement kept under `key`, if any (an unreadable file is measured anew)."""
    try:
        entry = json.loads((path or cache_path()).read_text())["entries"][key]
        return Crossover(**{**entry, "source": "cached", "key": key,
                            "linears": tuple(map(tuple, entry["linears"])), "steps": tuple(map(tuple, entry["steps"]))})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kept_for_this_cpu(path: Path | None = None) -> list[Crossover]:
    """Every measurement kept for this CPU (any model and dtype), oldest first."""
    try:
        keys = json.loads((path or cache_path()).read_text())["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    mine = f"{cpu_key()} |"
    found = [load_cached(key, path) for key in keys if key.startswith(mine)]
    return sorted((c for c in found if c is not None), key=lambda c: c.measured_at)


def store(found: Crossover, path: Path | None = None) -> None:
    """Adds `found` to the cache file, written whole and renamed into place (another process
    measuring at the same time loses nothing but its own entry, measured again next time)."""
    path = path or cache_path()
    try:
        entries = json.loads(path.read_text()).get("entries", {})
    except (OSError, ValueError, AttributeError):
        entries = {}
    entry = asdict(found)
    del entry["source"], entry["key"]
    entries[found.key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"entries": entries}, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: the next engine measures again


def resolve(runner: MeasuredRunner) -> Crossover | None:
    """This runner's limits: the setting, else the cached measurement, else a measurement now
    (kept for the next engine). None where nothing runs on the panels (no native kernels)."""
    linears = packed_linears(runner)
    if not linears:
        return None
    key = crossover_key(runner)
    chosen = setting()
    if chosen is not None:
        return Crossover(chosen[0], chosen[1], ENV_VAR, key)
    found = load_cached(key)
    if found is None or (runner.native_decode_off_reason is None and not found.steps):
        before, t0 = cpu_seconds(), time.perf_counter()
        found = measure(runner, linears, key)  # (a cached entry without steps: measured where the decode was off)
        others = others_cpus(before, cpu_seconds(), time.perf_counter() - t0)
        if others is None or others < BUSY_CPUS:
            store(found)
        else:
            found = replace(found, source="busy")
    return found


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds every process has used, steal time included; this process's), or None where
    /proc/stat is not there."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]   # idle and iowait: the rest (user, nice, system, irq, softirq, steal) is busy
    t = os.times()
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK"), t.user + t.system


def others_cpus(before: tuple[float, float] | None, after: tuple[float, float] | None, wall: float) -> float | None:
    """How many CPUs other processes kept busy on average between two `cpu_seconds` readings."""
    if before is None or after is None or wall <= 0:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall


def packed_linears(runner: MeasuredRunner) -> list[PackedLinear]:
    """Every PackedLinear with native panels (the layers' and the LM head), in forward order."""
    return [m for m in runner.model.modules() if isinstance(m, PackedLinear) and m.panels is not None]


def apply(runner: MeasuredRunner, found: Crossover) -> None:
    """Sets every packed linear's limit (the native decode takes its own at construction)."""
    for lin in packed_linears(runner):
        lin.native_max_rows = found.linear_max_rows


def measure(runner: MeasuredRunner, linears: list[PackedLinear], key: str) -> Crossover:
    t0 = time.perf_counter()
    layer_linears = [lin for lin in linears if lin is not runner.model.packed_lm_head]
    table = measure_linears(layer_linears)
    steps = measure_steps(runner, linears) if runner.native_decode_off_reason is None else ()
    return Crossover(limit_from(table), limit_from(steps), "measured", key,
                     datetime.now(timezone.utc).isoformat(timespec="seconds"), time.perf_counter() - t0,
                     table, steps)


def _ascending(candidates: tuple[int, ...], timed, every_row: bool = False) -> Table:
    """Times both paths at each row count (`timed(rows)` -> (ours ms, theirs ms)), upwards,
    stopping after two row counts in a row that the panels clearly lose (past them the arithmetic
    only grows in oneDNN's favour), unless `every_row` (the bench's full tables)."""
    table, losses = [], 0
    for rows in candidates:
        ours, theirs = timed(rows)
        table.append((rows, round(ours, 3), round(theirs, 3)))
        losses = losses + 1 if ours > CLEAR_LOSS * theirs else 0
        if losses == 2 and not every_row:
            break
    return tuple(table)


@torch.inference_mode()
def measure_linears(linears: list[PackedLinear], rows: tuple[int, ...] = LINEAR_ROWS, reps: int = REPS,
                    every_row: bool = False) -> Table:
    """The layer linears, every one in a forward's order (the set far past the L3, so each pass
    streams its weights from DRAM as a step does), both paths alternated: best of `reps` passes
    after one untimed pass each (oneDNN builds its primitive per shape)."""
    def timed(n: int) -> tuple[float, float]:
        inputs = {k: torch.randn(n, k) for k in {lin.in_features for lin in linears}}
        best = {"panels": float("inf"), "onednn": float("inf")}
        for i in range(reps + 1):
            for path in best:
                t0 = time.perf_counter()
                for lin in linears:
                    getattr(lin, f"{path}_linear")(inputs[lin.in_features])
                if i:
                    best[path] = min(best[path], (time.perf_counter() - t0) * 1e3)
        return best["panels"], best["onednn"]
    return _ascending(rows, timed, every_row)


@torch.inference_mode()
def measure_steps(runner: MeasuredRunner, linears: list[PackedLinear], rows: tuple[int, ...] = STEP_ROWS,
                  reps: int = REPS, every_row: bool = False) -> Table:
    """Pure-decode steps of each batch size as one native call and layer by layer with every
    linear on oneDNN (as the runner runs a batch past the limit, its packed inputs and attention
    metadata built each time), through a throwaway KV pool, alternated: best of `reps` after one
    untimed step each. The runner's own pool and limits are left as they were. A model with a
    sliding-window group gives that group the same blocks (the timing reads them alike)."""
    bs, top = runner.block_size, max(rows)
    per_seq = -(-STEP_CONTEXT // bs)
    shape = (1 + top * per_seq, bs, runner.spec.num_kv_heads // runner.tp.size, runner.spec.head_dim)
    caches = [(torch.zeros(shape, dtype=runner.dtype), torch.zeros(shape, dtype=runner.dtype))
              for _ in range(runner.spec.num_layers)]
    whole = NativeDecode(runner.model, caches, bs, STEP_CONTEXT, max_rows=top)
    own = [lin.native_max_rows for lin in linears]
    pos = STEP_CONTEXT - 1

    def timed(n: int) -> tuple[float, float]:
        tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(n)]
        ids, positions, seq_lens = [100 + i for i in range(n)], [pos] * n, [STEP_CONTEXT] * n
        slots = [t[pos // bs] * bs + pos % bs for t in tables]
        others = len(runner.kv_groups) - 1

        def native_step() -> None:
            whole.load(ids, positions, slots, seq_lens, tables, *((slots, tables) if others else ()))
            whole.run()

        def layer_step() -> None:
            batch = Batch(ids, positions, list(range(n + 1)), seq_lens, slots, tables, list(range(n)),
                          [slots] * others, [tables] * others)
            meta = runner.metadata(batch, [pos] * n, list(range(n)))
            hidden = runner.model(torch.tensor(ids), torch.tensor(positions), caches, runner.backend, meta)
            runner.model.compute_logits(hidden)

        best = {native_step: float("inf"), layer_step: float("inf")}
        for i in range(reps + 1):
            for step in best:
                t0 = time.perf_counter()
                step()
                if i:
                    best[step] = min(best[step], (time.perf_counter() - t0) * 1e3)
        return best[native_step], best[layer_step]

    for lin in linears:  # layer by layer past the limit: every linear on oneDNN
        lin.native_max_rows = 0
    try:
        return _ascending(rows, timed, every_row)
    finally:
        for lin, limit in zip(linears, own):
            lin.native_max_rows = limit


def summary(table: Table) -> str:
    """'rows: ours/theirs ms' for each row count measured."""
    return ", ".join(f"{r}: {a:.1f}/{b:.1f}" for r, a, b in table) or "-"

