"""Shared pytest fixtures. Each part keeps its fixtures in its own delimited section."""

from __future__ import annotations

# --- Triton on CPU: the interpreter -----------------------------------------------------
# Our Triton kernels (engine/attention/triton_kernels.py) run on a CPU-only machine only
# under Triton's interpreter, and triton reads TRITON_INTERPRET once, when it is first
# imported. Set it here, before any test module can import triton (torch's CPU build does
# not import triton on its own). setdefault: an explicit TRITON_INTERPRET=0 still wins.
import os

import torch as _torch

if not _torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# ------------------------------- end: Triton on CPU ------------------------------------

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# ---------------------------------------------------------------------------
# Model checkpoints: the default model and tiny random Qwen3 / Qwen2 / Llama
# checkpoints with Qwen's real tokenizer (benchmarks/checkpoints.py).
# ---------------------------------------------------------------------------
from benchmarks import checkpoints

# tests/ is on sys.path when it has no __init__.py (pytest's rootdir-less
# "prepend" import); the repository root is, when it has one.
try:
    from fixtures import flash_attn_reference
except ModuleNotFoundError:  # pragma: no cover - depends on how pytest imports tests/
    from tests.fixtures import flash_attn_reference

_WRITERS: dict[str, Callable[..., Path]] = {
    "qwen3": checkpoints.write_tiny_qwen3,
    "qwen2": checkpoints.write_tiny_qwen2,
    "llama": checkpoints.write_tiny_llama,
    "gemma3": checkpoints.write_tiny_gemma3,
}


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """SmolLM2-135M-Instruct as a local HF folder (converted once into the kvscope cache).

    Missing, it fails the tests that need it (make test installs it), except where
    KVSCOPE_TESTS_WITHOUT_DEFAULT_MODEL=1 says its absence is expected (scripts/gpu_check.sh
    on a GPU machine that was not carried its wheel): there they skip and say why."""
    from engine.default_model import DefaultModelError
    from engine.default_model import default_model_path as resolve

    try:
        return resolve()
    except DefaultModelError as e:
        if os.environ.get("KVSCOPE_TESTS_WITHOUT_DEFAULT_MODEL") == "1":
            pytest.skip(f"the default model is not installed here: {str(e).splitlines()[0]}")
        raise


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: `tiny_checkpoint("qwen3", num_layers=3)` -> folder, written once per session per arguments."""
    written: dict[tuple[str, tuple[tuple[str, Any], ...]], Path] = {}

    def make(architecture: str = "qwen3", **overrides: Any) -> Path:
        if architecture not in _WRITERS:
            raise ValueError(f"architecture must be one of {sorted(_WRITERS)}, got {architecture!r}")
        key = (architecture, tuple(sorted(overrides.items())))
        if key not in written:
            folder = tmp_path_factory.mktemp(f"tiny-{architecture}")
            written[key] = _WRITERS[architecture](folder, **overrides)
        return written[key]

    return make


@pytest.fixture(scope="session")
def tiny_qwen3_path(tiny_checkpoint: Callable[..., Path]) -> Path:
    """Random Qwen3 (2 layers, hidden 64, 4 heads / 2 KV heads, head_dim 16, tied embeddings)."""
    return tiny_checkpoint("qwen3")


@pytest.fixture(scope="session")
def tiny_qwen2_path(tiny_checkpoint: Callable[..., Path]) -> Path:
    """Random Qwen2 (same shape as tiny_qwen3_path; nonzero q/k/v biases, untied lm_head)."""
    return tiny_checkpoint("qwen2")


@pytest.fixture(scope="session")
def tiny_llama_path(tiny_checkpoint: Callable[..., Path]) -> Path:
    """Random Llama (same shape as tiny_qwen3_path, tied embeddings) with Qwen's tokenizer."""
    return tiny_checkpoint("llama")


@pytest.fixture(scope="session")
def qwen_tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only Qwen's tokenizer (AutoTokenizer.from_pretrained loads it)."""
    return checkpoints.write_qwen_tokenizer(tmp_path_factory.mktemp("qwen-tokenizer"))


@pytest.fixture(scope="session")
def hf_model_cache() -> Callable[[Path], tuple[Any, Any]]:
    """Loader: `model, tokenizer = hf_model_cache(path)`, transformers' reference, loaded once per path.

    The model is fp32 in eval mode; treat both as read-only, other tests share them.
    """
    loaded: dict[Path, tuple[Any, Any]] = {}

    def load(path: Path) -> tuple[Any, Any]:
        path = Path(path).resolve()
        if path not in loaded:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from engine.default_model import hf_offline

            with hf_offline():
                model = AutoModelForCausalLM.from_pretrained(path).to(torch.float32).eval()
                tokenizer = AutoTokenizer.from_pretrained(path)
            loaded[path] = (model, tokenizer)
        return loaded[path]

    return load


# --------------------------- end: model checkpoints ---------------------------


# --- markers: soak runs only when asked for; gpu only where CUDA is -------------------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Soak tests run only when the -m expression names them (`pytest -m soak`), whatever
    other -m filter is given; GPU tests are skipped cleanly on machines without CUDA."""
    wants_soak = "soak" in (config.getoption("-m") or "") and "not soak" not in (config.getoption("-m") or "")
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    for item in items:
        if "soak" in item.keywords and not wants_soak:
            item.add_marker(pytest.mark.skip(reason="soak test: run with `pytest -m soak`"))
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"))


# --- one browser for the whole session ---------------------------------------------------
# Playwright's sync API refuses a second sync_playwright() while one is running, so the
# e2e tests and the panel tests share this one.
@pytest.fixture(scope="session")
def chromium_path() -> str:
    from benchmarks.lab_harness import find_chromium

    path = find_chromium()
    if path is None:
        pytest.skip("Debian chromium is not installed (scripts/setup.sh --with-browser installs it)")
    return path


@pytest.fixture(scope="session")
def browser(chromium_path: str):
    from benchmarks.lab_harness import CHROMIUM_ARGS

    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


# --- JavaScript that node must parse -----------------------------------------------------
@pytest.fixture
def assert_node_parses(tmp_path: Path) -> Callable[[str, str], None]:
    """`check(source, filename)`: `node --check` parses `source` as an ES module (written to
    `tmp_path / filename`, an .mjs name); the test is skipped where node is not installed."""
    import shutil
    import subprocess

    def check(source: str, filename: str) -> None:
        node = shutil.which("node")
        if node is None:
            pytest.skip("node is not installed")
        module = tmp_path / filename
        module.write_text(source)
        result = subprocess.run([node, "--check", str(module)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr

    return check


# --- flash-attn's transcription ---------------------------------------------------------
FLASH_BACKEND_MODULE = "engine.attention.flash_attn_backend"


@pytest.fixture
def flash_attn_transcription(monkeypatch: pytest.MonkeyPatch):
    """tests/fixtures/flash_attn_reference.py importable as `flash_attn` for one test (the
    package itself builds only against CUDA), with the flash_attn backend imported anew and
    forgotten afterwards, so no other test sees it. Yields the transcription module."""
    import sys

    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn_reference)
    monkeypatch.delitem(sys.modules, FLASH_BACKEND_MODULE, raising=False)
    flash_attn_reference.CALLS.clear()
    yield flash_attn_reference
    sys.modules.pop(FLASH_BACKEND_MODULE, None)
# ------------------------------- end: flash-attn's transcription -------------------------


# --- a vLLM server's log in a failed test's report --------------------------------------
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails with a VllmServer among its fixtures gets the server's log (path and
    last lines) as a section of its report. A server that fails to start says the same in
    its own error (ServerStartError)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    from explorer.drivers.vllm_live.server import VllmServer

    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, VllmServer):
            report.sections.append((f"vLLM server {name}: {value.log_path} (its last lines)", value.log_tail()))
# ------------------------------- end: a vLLM server's log -------------------------------
# --- a data-parallel vLLM server --------------------------------------------------------
@pytest.fixture(scope="session")
def dp_server(default_model_path):
    """One vLLM OpenAI server with data parallelism 2 on this CPU (two engine cores, each with
    its own scheduler and kvscope recorder, one thread each), shared by the tests that need it
    (tests/explorer/test_vllm_live_dp.py, tests/e2e/test_fleet_browser.py): it takes a minute
    to start."""
    from tests.oracle.vllm_available import require_vllm

    require_vllm()
    pytest.importorskip("openai")
    from explorer.drivers.vllm_live.server import VllmServer

    srv = VllmServer(default_model_path, num_gpu_blocks=64, block_size=32, max_model_len=1024, kv_events=False,
                     data_parallel_size=2, log=os.environ.get("KVSCOPE_LIVE_TEST_LOG"),
                     env={"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    try:
        srv.start().wait_ready(600)
        yield srv
    finally:
        srv.stop()
# ------------------------------- end: a data-parallel vLLM server ------------------------
