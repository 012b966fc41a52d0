"""One rank's tensor-parallel state: its rank, the group size, the process group its
collectives run on, and the time they took.

Groups are built per engine from a `TCPStore` the engine owns (never the process-wide
default group): one process can hold rank 0 of several engines at once, one after the
other or side by side, and no two engines share a port or a store key.
"""
from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .sharding import ShardedShape

# Generous: a collective waits for the slowest rank's whole layer (a long prefill on a
# loaded CPU). A crashed peer is reported at once (gloo sees the socket close); this only
# bounds a peer that is alive but stuck.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died or failed, or the engine's workers were shut down."""


@dataclass(eq=False)
class TensorParallel:
    """How one rank takes part in its engine's tensor-parallel group.

    At size 1 every collective returns its input untouched and times nothing, so the
    single-process engine runs exactly the code (and numerics) it always did.
    """

    rank: int = 0
    size: int = 1
    group: Any = None                  # a c10d ProcessGroupGloo / ProcessGroupNCCL; None at size 1
    backend: str | None = None         # 'gloo' | 'nccl'
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _seconds: float = 0.0
    _events: list = field(default_factory=list)

    # -- collectives --------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it."""
        if self.size == 1:
            return x
        self._timed(lambda: self.group.allreduce([x]).wait())
        return x

    def gather_to_first(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
        """Every rank's `x` concatenated along `dim` in rank order, on rank 0; None elsewhere."""
        if self.size == 1:
            return x
        x = x.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        if self.rank != 0:
            self._timed(lambda: self.group.gather([], [x], opts).wait())
            return None
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._timed(lambda: self.group.gather([parts], [x], opts).wait())
        return torch.cat(parts, dim=dim)

    # -- timing -------------------------------------------------------------------------
    def _timed(self, run) -> None:
        if self.rank != 0:  # only rank 0 reports (and resets) the time; workers just run
            run()
            return
        if self.device.type == "cuda":
            # NCCL's wait() does not block the host: time the stream with events instead.
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            self._events.append((start, end))
            return
        t0 = time.perf_counter()
        run()
        self._seconds += time.perf_counter() - t0

    def reset_timer(self) -> None:
        self._seconds, self._events = 0.0, []

    def collective_ms(self) -> float:
        """Milliseconds spent in collectives since `reset_timer` (on this rank)."""
        ms = self._seconds * 1e3
        if self._events:
            self._events[-1][1].synchronize()
            ms += sum(s.elapsed_time(e) for s, e in self._events)
        return ms


SINGLE = TensorParallel()


def new_group(store: dist.Store, rank: int, size: int, backend: str,
              timeout: datetime.timedelta = COLLECTIVE_TIMEOUT) -> Any:
    """A process group built directly on `store` (its own key prefix), outside c10d's
    default group: returns once all `size` ranks have joined."""
    prefix = dist.PrefixStore("kvscope-tp", store)
    if backend == "gloo":
        try:
            # torch's stubs leave out ProcessGroupGloo._Options (private; an older torch has none: below).
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            opts._timeout = timeout
            # Every rank is on this machine: loopback needs no hostname lookup.
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            return dist.ProcessGroupGloo(prefix, rank, size, opts)
        except AttributeError:  # an older torch without _Options: its default device
            return dist.ProcessGroupGloo(prefix, rank, size, timeout)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefix, rank, size, opts)
    raise ValueError(f"tensor-parallel backend must be 'gloo' or 'nccl', got {backend!r}")


def check_tensor_parallel(spec: ShardedShape, size: int) -> None:
    """ValueError (naming the model field) unless every sharded dimension splits evenly."""
    if size == 1:
        return
    for name, hf_name, value in (("num_heads", "num_attention_heads", spec.num_heads),
                                 ("num_kv_heads", "num_key_value_heads", spec.num_kv_heads),
                                 ("vocab_size", "vocab_size", spec.vocab_size),
                                 ("intermediate_size", "intermediate_size", spec.intermediate_size)):
        if value % size:
            raise ValueError(
                f"tensor_parallel_size={size} does not divide the model's {name} ({hf_name}={value} in "
                f"config.json): each rank holds {name}/tensor_parallel_size of them; choose a divisor of {value}")
