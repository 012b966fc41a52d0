"""Rank 0's side of a tensor-parallel engine: start the worker processes, send each step's
inputs, notice a dead worker quickly, and stop them all with the engine.

Each engine owns its rendezvous: a TCPStore on a port the OS picks (port 0), and a process
group built directly on it (never torch.distributed's default group), so several engines
can live in one process, one after the other or side by side.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import time
import weakref
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..config import EngineConfig
from ..model import ModelSpec
from .parallel_state import TensorParallel, TensorParallelError, check_tensor_parallel, new_group
from .worker import ForwardInputs, WorkerArgs, worker_main

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0   # spawn + import torch + load a shard; a dead worker is reported at once


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
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.closed: str | None = None  # why the group can no longer run steps
        # Runs at garbage collection or interpreter exit if shutdown() was never called.
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns, True)
        self._store = dist.TCPStore(HOST, 0, size, True, timeout=datetime.timedelta(seconds=START_TIMEOUT_S),
                                    wait_for_workers=False)
        ctx = mp.get_context("spawn")  # fork would copy the caller's threads and CUDA state
        threads = max(1, (os.cpu_count() or 1) // size)
        try:
            for rank in range(1, size):
                parent, child = ctx.Pipe()
                args = WorkerArgs(rank, size, HOST, self._store.port, self.backend, config, spec, max_model_len, threads)
                proc = ctx.Process(target=worker_main, args=(args, child), name=f"kvscope-tp-rank{rank}", daemon=True)
                proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(parent)
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
            self.tp.group = new_group(self._store, 0, self.size, self.backend)
            self.send("kv", num_blocks)
            self._expect("ready")
        except BaseException:
            self.shutdown(graceful=False)
            raise

    def _expect(self, kind: str, timeout: float = START_TIMEOUT_S) -> None:
        """Wait for message `kind` from every worker; a dead or failing worker raises at once."""
        deadline = time.monotonic() + timeout
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            while not conn.poll(0.05):
                if not proc.is_alive() or time.monotonic() > deadline:
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
            if proc.exitcode is not None:
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
        except Exception as exc:
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
                if proc.exitcode is not None:
                    self._fail("during the step")
            time.sleep(0.0005)

    def _fail(self, when: str, cause: BaseException | None = None) -> None:
        """Stop every worker and raise a TensorParallelError saying which rank failed and how."""
        deadline = time.monotonic() + 2.0  # a worker whose socket just closed is exiting now
        while cause is not None and time.monotonic() < deadline and all(p.exitcode is None for p in self.procs):
            time.sleep(0.02)
        problems = []
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            report = _pending_error(conn)
            if report:
                problems.append(f"worker rank {rank} failed: {report}")
            elif proc.exitcode is not None:
                problems.append(f"worker rank {rank} (pid {proc.pid}) {_exit_text(proc.exitcode)}")
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


def _stop(procs: list, conns: list, graceful: bool) -> None:
    if graceful:
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.send(("shutdown", None))
        deadline = time.monotonic() + 5.0
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.exitcode is None:
            proc.terminate()
            proc.join(1.0)
        if proc.exitcode is None:
            proc.kill()
            proc.join(1.0)
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.close()


def _pending_error(conn: Any) -> str | None:
    """The traceback a failing worker sent, if one is waiting in the pipe."""
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
