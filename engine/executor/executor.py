"""Rank 0's side of a tensor-parallel engine: start the worker processes, send each step's
inputs, notice a dead worker quickly, and stop them all with the engine.

Each engine owns its rendezvous: a TCPStore on a port the OS picks (port 0), and a process
group built directly on it (never torch.distributed's default group), so several engines
can live in one process, one after the other or side by side.

Workers are fresh interpreters (`subprocess`), not multiprocessing's spawn: spawn re-imports
the caller's `__main__` in every worker, so a plain script that makes an `LLM(...,
tensor_parallel_size=2)` at its top level, without an `if __name__ == "__main__":` guard,
would start workers from its workers (multiprocessing refuses: "...before the current process
has finished its bootstrapping phase"). A worker imports only the engine. (Not fork either:
it would copy the caller's threads and CUDA state.) Each worker talks to rank 0 over its own
end of a socketpair, inherited as a file descriptor: private to the two processes, so it
needs no port and no authentication key.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..config import EngineConfig
from ..model import ModelSpec
from ..parallel.parallel_state import TensorParallel, TensorParallelError, check_tensor_parallel, new_group
from .worker import ForwardInputs, WorkerArgs

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0   # start python + import torch + load a shard; a dead worker is reported at once

# The folder holding this `engine` package: first on each worker's sys.path, so a worker runs
# the very files rank 0 runs, whatever its working directory, PYTHONPATH or installed copies.
ENGINE_ROOT = str(Path(__file__).resolve().parents[2])
# A worker's program (python -c; argv: ENGINE_ROOT, the socket's fd). Ctrl-C in a terminal
# reaches the whole process group: rank 0 decides what an interrupt means (it stops the
# workers if one lands mid-step), so a worker ignores SIGINT from its first line on.
WORKER_PROGRAM = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "sys.path.insert(0, sys.argv[1]); "
                  "from engine.executor.worker import main; main(int(sys.argv[2]))")


class WorkerGroup:
    """The worker processes (ranks 1..N-1) of one engine, and rank 0's `tp` state.

    Life: spawn (returns at once; rank 0 loads its own shard and the tokenizer meanwhile)
    -> `connect(num_blocks)`: 'hello' from each worker once its shard is loaded, everyone
    joins the process group, each worker allocates its KV pool -> steps. Any
    failure while ranks run together stops every worker (a rank left inside a collective
    cannot be talked to any more) and raises `TensorParallelError` naming the rank.
    """

    def __init__(self, config: EngineConfig, spec: ModelSpec, max_model_len: int, device: torch.device) -> None:
        size = config.tensor_parallel_size
        check_tensor_parallel(spec, size)
        self.size = size
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if self.backend == "nccl" and torch.cuda.device_count() < size:
            raise ValueError(f"tensor_parallel_size={size} needs {size} CUDA GPUs (one per rank); "
                             f"torch sees {torch.cuda.device_count()}")
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        self.closed: str | None = None  # why the group can no longer run steps
        # Runs at garbage collection or interpreter exit if shutdown() was never called.
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns, True)
        store = dist.TCPStore(HOST, 0, size, True, timeout=datetime.timedelta(seconds=START_TIMEOUT_S),
                              wait_for_workers=False)
        self._store: dist.TCPStore | None = store  # None once shut down
        threads = max(1, (os.cpu_count() or 1) // size)
        try:
            for rank in range(1, size):
                args = WorkerArgs(rank, size, HOST, store.port, self.backend, config, spec, max_model_len, threads)
                _start_worker(args, self.procs, self.conns)
        except BaseException:
            self.shutdown(graceful=False)
            raise
        rank0_device = torch.device("cuda", 0) if self.backend == "nccl" else torch.device("cpu")
        # The group is joined in connect(); layers keep this object and see it then.
        self.tp = TensorParallel(0, size, None, self.backend, rank0_device)

    # -- start-up -----------------------------------------------------------------------
    def connect(self, num_blocks: int) -> None:
        """Wait for every worker's shard, join the process group, and have each worker
        allocate a KV pool of `num_blocks` (the same block ids and slots on every rank)."""
        try:
            self._expect("hello")
            if self.tp.device.type == "cuda":
                torch.cuda.set_device(self.tp.device)
            if self._store is None:
                raise TensorParallelError(f"this engine's tensor-parallel workers are stopped ({self.closed})")
            self.tp.group = new_group(self._store, 0, self.size, self.backend)
            self.send("kv", num_blocks)
            self._expect("ready")
        except BaseException:
            self.shutdown(graceful=False)
            raise

    def _expect(self, kind: str, timeout: float = START_TIMEOUT_S) -> None:
        """Wait for message `kind` from every worker; a dead or failing worker raises at once."""
        deadline = time.monotonic() + timeout
        for proc, conn in zip(self.procs, self.conns):
            while not conn.poll(0.05):
                if proc.poll() is not None or time.monotonic() > deadline:
                    self._fail(f"while starting (waiting for {kind!r})")
            got, payload = conn.recv()
            if got == "error":
                self._fail(f"while starting: {payload}")
            if got != kind:
                self._fail(f"while starting: expected {kind!r}, got {got!r}")

    # -- steps --------------------------------------------------------------------------
    def send_forward(self, meta: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                     logits_indices: list[int]) -> None:
        self.send("forward", ForwardInputs.from_step(meta, input_ids, positions, logits_indices))

    def send(self, kind: str, payload: Any) -> None:
        """Send one message to every worker (after checking that all are alive)."""
        if self.closed:
            raise TensorParallelError(f"this engine's tensor-parallel workers are stopped ({self.closed}); "
                                      f"create a new LLM")
        for proc in self.procs:
            if proc.poll() is not None:
                self._fail("before the step")
        try:
            for conn in self.conns:
                conn.send((kind, payload))
        except (OSError, EOFError):
            self._fail("sending the step")

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Around rank 0's part of a step: on any error or interrupt, stop the workers (they
        may be waiting in a collective rank 0 will never join) and say which rank failed."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - any failure leaves workers waiting in a collective
            self._fail("during the step", cause=exc)
        except BaseException:  # KeyboardInterrupt: stop the workers, keep the interrupt
            self.shutdown(graceful=False, reason="interrupted during a step")
            raise

    def wait_until_done(self, tensor: torch.Tensor) -> None:
        """Wait for the CUDA work producing `tensor`, checking the workers meanwhile: NCCL does
        not notice a dead peer, its collective would wait forever."""
        event = torch.cuda.Event()
        event.record()
        while not event.query():
            for proc in self.procs:
                if proc.poll() is not None:
                    self._fail("during the step")
            time.sleep(0.0005)

    def _fail(self, when: str, cause: BaseException | None = None) -> None:
        """Stop every worker and raise a TensorParallelError saying which rank failed and how."""
        deadline = time.monotonic() + 2.0  # a worker whose socket just closed is exiting now
        while cause is not None and time.monotonic() < deadline and all(p.poll() is None for p in self.procs):
            time.sleep(0.02)
        problems = []
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            report = _pending_error(conn)
            if report:
                problems.append(f"worker rank {rank} failed: {report}")
            elif proc.poll() is not None:
                problems.append(f"worker rank {rank} (pid {proc.pid}) {_exit_text(proc.returncode)}")
        if not problems:
            problems.append(f"rank 0 failed: {type(cause).__name__}: {cause}" if cause is not None
                            else "a worker stopped answering")
        message = f"tensor parallel engine {when}: " + "; ".join(problems)
        self.shutdown(graceful=False, reason=message)
        raise TensorParallelError(message + "; all workers were stopped") from cause

    # -- the end ------------------------------------------------------------------------
    def shutdown(self, graceful: bool = True, reason: str = "the engine was shut down") -> None:
        """Stop the workers: ask politely, then terminate and kill what is left (idempotent)."""
        if self.closed is None:
            self.closed = reason
        self._finalizer.detach()
        _stop(self.procs, self.conns, graceful)
        tp = getattr(self, "tp", None)
        if tp is not None and tp.group is not None:
            if self.backend == "nccl":
                with contextlib.suppress(Exception):
                    tp.group.abort()  # frees a communicator a dead peer left stuck
            tp.group = None
        self._store = None


def _start_worker(args: WorkerArgs, procs: list[subprocess.Popen], conns: list[Connection]) -> None:
    """Start rank `args.rank` (see WORKER_PROGRAM) and send it `args` over its socket; the
    process and rank 0's end of the socket are appended to `procs` and `conns`."""
    ours, theirs = socket.socketpair()
    with theirs:  # the worker's end: inherited by the worker (pass_fds), closed here
        try:
            proc = subprocess.Popen([sys.executable, "-c", WORKER_PROGRAM, ENGINE_ROOT, str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
    procs.append(proc)
    conn = Connection(ours.detach())
    conns.append(conn)
    conn.send(args)  # a few kB: the socket buffers it while the worker starts


def _stop(procs: list[subprocess.Popen], conns: list[Connection], graceful: bool) -> None:
    if graceful:
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.send(("shutdown", None))
        deadline = time.monotonic() + 5.0
        for proc in procs:
            _wait(proc, max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            _wait(proc, 1.0)
        if proc.poll() is None:
            proc.kill()
            _wait(proc, 1.0)
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.close()


def _wait(proc: subprocess.Popen, timeout: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)


def _pending_error(conn: Any) -> str | None:
    """The traceback a failing worker sent, if one is waiting on its socket."""
    try:
        while conn.poll(0):
            kind, payload = conn.recv()
            if kind == "error":
                return str(payload)
    except (OSError, EOFError):
        pass
    return None


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
