"""vLLM mode as README prints it, without starting vLLM: max_num_seqs left at its default is
lowered to a small token budget with a notice (vLLM refuses seqs > budget), asked for
explicitly it is one error naming both knobs; and vLLM's start-up output (Python's and C's,
on file descriptors 1 and 2) folds into one line with the whole log kept."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from explorer.drivers.vllm.config import VllmConfig, fit_max_num_seqs
from explorer.drivers.vllm.startup import count_warnings, last_line, progress_line


def test_readmes_budget_lowers_the_default_max_num_seqs_with_a_notice() -> None:
    config, notice = fit_max_num_seqs(VllmConfig(block_size=32, max_num_batched_tokens=96), explicit=False)
    assert config.max_num_seqs == 96 and config.max_num_batched_tokens == 96
    assert "max_num_seqs lowered from 256 to 96" in notice and "max_num_batched_tokens" in notice
    same, none = fit_max_num_seqs(VllmConfig(max_num_batched_tokens=2048), explicit=False)
    assert same.max_num_seqs == 256 and none == ""


def test_an_explicit_max_num_seqs_above_the_budget_is_one_error_naming_both_knobs() -> None:
    with pytest.raises(ValueError) as err:
        fit_max_num_seqs(VllmConfig(max_num_batched_tokens=96, max_num_seqs=128), explicit=True)
    text = str(err.value)
    assert "max_num_seqs (128)" in text and "max_num_batched_tokens (96)" in text and "\n" not in text


def test_the_latest_line_of_console_output_drops_colours_and_redrawn_bars() -> None:
    text = "INFO starting\n\x1b[33mWARNING numa\x1b[0m\nLoading safetensors: 10%\rLoading safetensors: 100%\r\n"
    assert last_line(text) == "Loading safetensors: 100%"
    assert last_line("\n \n") == ""


def test_startup_output_folds_into_one_line_and_keeps_the_whole_log() -> None:
    # A fresh interpreter: its file descriptors 1 and 2 are pipes this test reads.
    script = textwrap.dedent("""
        import logging, os, sys, time, warnings
        from explorer.drivers.vllm.startup import StartupLog
        logging.basicConfig(level=logging.INFO)
        with StartupLog("vLLM 0.32.0") as s:
            s.note = "max_num_seqs lowered from 256 to 96"
            print("python stdout line")
            logging.getLogger("vllm.x").warning("a logger warning")
            warnings.warn("a python warning")
            os.write(2, b"NUMA note written by C++\\n")
            time.sleep(0.7)
        print("after:", len(s.log_text.splitlines()), s.path)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for noise in ("python stdout line", "a logger warning", "a python warning", "NUMA note"):
        assert noise not in out.stdout and noise not in out.stderr, (noise, out.stdout, out.stderr)
    final = out.stderr.strip().split("\r")[-1]
    assert final.startswith("vLLM 0.32.0 started in") and "max_num_seqs lowered from 256 to 96" in final, out.stderr
    assert "start-up log: " in final
    lines, path = out.stdout.split("after: ")[1].split()
    log = open(path, encoding="utf-8").read()
    assert int(lines) >= 4
    for noise in ("python stdout line", "a logger warning", "a python warning", "NUMA note written by C++"):
        assert noise in log


def test_the_progress_line_skips_warnings_and_the_loggers_prefix() -> None:
    text = ("INFO 12-03 10:00:00 [loader.py:12] Loading weights took 0.3 s\n"
            "\x1b[33mWARNING 12-03 10:00:01 [numa.py:3] NUMA is off\x1b[0m\n"
            "/x/y.py:3: DeprecationWarning: an old thing\n  warnings.warn(\n")
    assert progress_line(text) == "Loading weights took 0.3 s"
    assert count_warnings(text) == 2
    assert progress_line("(EngineCore_DP0 pid=12) INFO 12-03 10:00:00 [core.py:1] init engine\n") == "init engine"
    assert progress_line("WARNING 12-03 10:00:01 [numa.py:3] NUMA is off\n") == ""


def test_a_notebooks_progress_bar_is_console_text_in_the_log_while_vllm_starts() -> None:
    # In a notebook tqdm.auto is tqdm.notebook's widget bar, which IPython displays in the cell,
    # past any capture; vLLM's weight loader binds it at import (`from tqdm.auto import tqdm`).
    script = textwrap.dedent("""
        import sys, types, tqdm.asyncio, tqdm.auto, tqdm.notebook, tqdm.std
        class kernel_bar(tqdm.notebook.tqdm, tqdm.asyncio.tqdm):  # tqdm.auto's class in a kernel
            pass
        kernel_bar.__module__ = "tqdm.auto"
        tqdm.auto.tqdm = kernel_bar
        early = types.ModuleType("vllm.model_executor.early")  # a vLLM module imported before
        early.tqdm = kernel_bar
        sys.modules[early.__name__] = early
        from explorer.drivers.vllm.startup import StartupLog
        with StartupLog("vLLM 0.32.0") as s:
            from tqdm.auto import tqdm as bar                 # a vLLM module imported while starting
            assert bar is tqdm.std.tqdm and early.tqdm is tqdm.std.tqdm
            for _ in bar(range(2), desc="Loading safetensors checkpoint shards"):
                pass
        assert tqdm.auto.tqdm is kernel_bar and early.tqdm is kernel_bar  # put back
        print("LOG", "Loading safetensors checkpoint shards: 100%" in s.log_text)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOG True" in out.stdout and "Loading safetensors" not in out.stderr.split("\r")[-1], out.stderr
