"""A tensor-parallel worker process (ranks 1..N-1): its model shard, its KV shard, and a
loop that runs whatever rank 0 sends over its socket.

`executor.WorkerGroup` starts it as a fresh interpreter that runs `main(fd)` (never the
caller's `__main__` module). The first message on the socket is its `WorkerArgs`; the
others from rank 0 are `(kind, payload)` tuples: 'kv' (the pool's block count),
'forward' (a `ForwardInputs`), 'probe' (ModelRunner.probe's arguments), 'shutdown'.
The worker answers only at start-up ('hello' once its shard is loaded, 'ready') and with
('error', traceback) when it fails; during steps the collectives keep ranks in step.
"""
from __future__ import annotations

import os
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from ..attention import AttentionMetadata
from ..config import EngineConfig
from ..model import ModelSpec


@dataclass
class WorkerArgs:
    """What a worker needs to join its engine's group and build its shard."""

    rank: int
    size: int
    store_host: str
    store_port: int
    backend: str
    config: EngineConfig
    spec: ModelSpec
    max_model_len: int
    num_threads: int


@dataclass
class ForwardInputs:
    """One step's packed batch as plain lists: all a worker needs to rebuild the same
    AttentionMetadata and run its shard of the forward pass."""

    input_ids: list[int]
    positions: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    context_lens: list[int]
    slot_mapping: list[int]
    block_tables: list[list[int]]   # padded with the null block, as in the metadata
    decode_seq_ids: list[int]
    logits_indices: list[int]

    @classmethod
    def from_step(cls, meta: AttentionMetadata, input_ids: torch.Tensor, positions: torch.Tensor,
                  logits_indices: list[int]) -> ForwardInputs:
        return cls(input_ids.tolist(), positions.tolist(), list(meta.query_start_loc), list(meta.seq_lens),
                   list(meta.context_lens), meta.slot_mapping.tolist(), meta.block_tables.tolist(),
                   list(meta.decode_seq_ids), list(logits_indices))

    def run(self, runner: Any) -> None:
        from ..runner.batch import Batch

        batch = Batch(self.input_ids, self.positions, self.query_start_loc, self.seq_lens, self.slot_mapping,
                      self.block_tables, self.logits_indices)
        meta = runner.metadata(batch, self.context_lens, self.decode_seq_ids)
        dev = runner.device
        runner.forward(meta, torch.tensor(self.input_ids, dtype=torch.long, device=dev),
                       torch.tensor(self.positions, dtype=torch.long, device=dev), self.logits_indices)


def main(fd: int) -> None:
    """Process entry: `fd` is this worker's end of the socket to rank 0, which sends the
    `WorkerArgs` first. Never returns: exits when rank 0 says 'shutdown' or goes away (the
    socket closes, or a collective fails because its socket closed)."""
    conn = Connection(fd)
    rank: int | str = "?"  # until the WorkerArgs arrive
    code = 0
    try:
        args: WorkerArgs = conn.recv()
        rank = args.rank
        _serve(args, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # rank 0 is gone: nothing left to serve
    except BaseException:  # noqa: BLE001 - reported to rank 0, which raises it in the caller
        code = 1
        try:
            conn.send(("error", f"rank {rank} (pid {os.getpid()}):\n{traceback.format_exc()}"))
        except OSError:
            pass
    # Skip interpreter teardown: it takes a second or two with torch loaded, and a broken
    # process group can hang in its destructor.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve(args: WorkerArgs, conn: Any) -> None:
    import torch.distributed as dist
    from tqdm import tqdm

    from ..dtypes import resolve_dtype
    from ..parallel.parallel_state import COLLECTIVE_TIMEOUT, TensorParallel, new_group
    from ..runner.model_runner import ModelRunner, build_model

    # tqdm (the weight loader's console bar, engine/progress.py, where this rank draws it) would otherwise
    # create a multiprocessing RLock: a named semaphore wherever multiprocessing's start method
    # is not fork (in a spawn child, as workers once were; everywhere with Python 3.14's
    # forkserver default). os._exit below leaves it behind, and the resource tracker reports
    # it at shutdown as "leaked semaphore objects". One thread: a thread lock is enough.
    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(args.num_threads)
    device = torch.device("cuda", args.rank) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tp = TensorParallel(args.rank, args.size, None, args.backend, device)
    model = build_model(args.config, args.spec, args.max_model_len, device,
                        resolve_dtype(args.config.dtype, device), tp)
    # Rank 0 joins the group only after this: it never blocks on a worker that died loading.
    conn.send(("hello", os.getpid()))
    store = dist.TCPStore(args.store_host, args.store_port, args.size, False, timeout=COLLECTIVE_TIMEOUT)
    tp.group = new_group(store, args.rank, args.size, args.backend)
    kind, num_blocks = conn.recv()
    if kind != "kv":
        return
    runner = ModelRunner(args.config, args.spec, args.max_model_len, model=model, tp=tp, num_blocks=num_blocks)
    conn.send(("ready", None))
    while True:
        kind, payload = conn.recv()
        if kind == "forward":
            payload.run(runner)
        elif kind == "probe":
            runner.probe(*payload)
        elif kind == "shutdown":
            return
        else:
            raise ValueError(f"unknown message {kind!r} from rank 0")
