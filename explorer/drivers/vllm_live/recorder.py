"""The recorder: a subclass of vLLM 0.32's own v1 Scheduler that publishes every step.

    KVSCOPE_FEED=tcp://127.0.0.1:5590 python -m vllm.entrypoints.openai.api_server \\
        --model DIR --scheduler-cls explorer.drivers.vllm_live.RecordingScheduler

It runs in vLLM's engine-core process, next to the KV cache manager and its block pool.
What one step did is observed on vLLM's own objects (explorer.drivers.vllm.capture's block-pool
hooks, the SchedulerOutput, the EngineCoreOutputs its update returns, the scheduler's block
tables) and turned into kvscope's StepRecord /
EngineSnapshot dicts by the same functions the in-process adapter uses
(explorer.drivers.vllm.records). Then it is published without blocking (explorer.drivers.vllm_live.protocol):
no subscriber, or one that does not read, costs a counter, never a wait.

Each step is keyed by its SchedulerOutput, so vLLM's async scheduling (schedule N+1 before
update N) keeps each step's events apart. A step's snapshot is taken after its update, so
with async scheduling it already holds the next step's allocations.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from types import SimpleNamespace
from typing import Any

from engine.report.records import EngineSnapshot, gc_paused
from engine.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler

from ..vllm.capture import BLOCK_EVENTS, Capture, StepCapture
from ..vllm.changes import BlockTables, ChangeTracker
from ..vllm.records import RecordBuilder, RequestState, computed_before
from . import protocol

log = logging.getLogger("vllm.kvscope_recorder")  # a child of vLLM's logger: its handler and format


class _Out:
    """vLLM's EngineCoreOutput seen as the RequestOutput RecordBuilder.step_record reads."""

    def __init__(self, o: Any) -> None:
        self.request_id = o.request_id
        reason = o.finish_reason
        self.finished = reason is not None
        self.outputs = [SimpleNamespace(token_ids=list(o.new_token_ids), logprobs=None,
                                        finish_reason=None if reason is None else reason.name.lower())]


class RecordingScheduler(Scheduler):
    """vLLM's v1 Scheduler, unchanged in what it decides, publishing each step to kvscope."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kv = _ServerView(self)
        self._feed = _Publisher(protocol.feed_settings(), self._kv)

    # -- vLLM's calls -------------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        super().add_request(request)
        self._kv.track(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        kv = self._kv
        cap = kv.begin_step()
        t0 = time.perf_counter()
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            kv.capture.now = kv.between
        t1, c1 = time.perf_counter(), time.thread_time()
        cap.seconds["schedule"] = t1 - t0
        cap.out = out
        cap.counts = {rid: (self.requests[rid].num_tokens, self.requests[rid].num_prompt_tokens)
                      for rid in out.num_scheduled_tokens}
        cap.token_budget = int(self.max_num_scheduled_tokens)
        cap.started = t0
        self._feed.count_subscribers()  # a client that joined since the last step gets this step's batch
        if self._feed.subscribers:
            with gc_paused():  # many small acyclic containers: no cyclic GC pass over the server's heap
                cap.batch_req_ids, cap.batch = kv.scheduler_batch(out)
        kv.pending[id(out)] = cap
        self._feed.own_time(time.perf_counter() - t1, time.thread_time() - c1)
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        kv = self._kv
        cap = kv.pending.pop(id(scheduler_output), None) or Capture(out=scheduler_output)
        kv.join_between(cap)  # what happened since it was scheduled (an abort's frees) is this step's
        kv.capture.now = cap
        t0 = time.perf_counter()
        try:
            result = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            kv.capture.now = kv.between
        t1, c1 = time.perf_counter(), time.thread_time()
        cap.seconds["update"] = t1 - t0
        try:
            with gc_paused():
                self._feed.step(kv.record_step(cap, result))
        except Exception:  # noqa: BLE001 - the recorder must never take the server down
            log.exception("kvscope recorder: a step could not be recorded")
        self._feed.own_time(time.perf_counter() - t1, time.thread_time() - c1, step=True)
        return result

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        result = super().finish_requests(request_ids, finished_status)
        self._kv.finished_outside_step(request_ids, finished_status)
        return result

    def shutdown(self) -> None:
        self._feed.close()
        super().shutdown()


class _ServerView:
    """The recorder's state for the server's scheduler: its RecordBuilder (per-request state,
    counters, the engine clock), its block tables, the captures of the steps in flight, and
    the tracker of what changed since the subscribers' state (explorer.drivers.vllm.changes)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.capture = StepCapture(scheduler, None, hook_scheduler=False)  # the block pool's hooks
        self.between = self.capture.now  # events outside any step (an abort's frees) join a step
        self.pending: dict[int, Capture] = {}
        vc = scheduler.vllm_config
        # No tokenizer: the feed carries token ids, the client spells them.
        self.records = RecordBuilder(scheduler, model_info=_model_info(vc),
                                     reserve_full_isl=bool(getattr(scheduler, "scheduler_reserve_full_isl", True)))
        self.finished: deque[RequestState] = deque(maxlen=protocol.feed_settings()["finished"])
        self.config_dict = _config_dict(vc, scheduler)
        self.table = BlockTables(scheduler)
        self.tracker = ChangeTracker(self.records, self.table)

    # -- requests ------------------------------------------------------------------------------
    def track(self, request: Any) -> None:
        rid = request.request_id
        self.records.track(RequestState(rid, rid, request, _params(request), None), float(request.arrival_time))
        self.tracker.note_request(rid)

    def finished_outside_step(self, request_ids: Any, status: Any) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
        reason = "abort" if "ABORT" in getattr(status, "name", str(status)) else "stop"
        for rid in ids:
            entry = self.records.requests.get(rid)
            if entry is not None and entry.finish_reason is None:
                self.records.finish(entry, reason, time.time())

    # -- the packed batch ----------------------------------------------------------------------
    def scheduler_batch(self, out: Any) -> tuple[list[str], dict]:
        """The packed batch as the scheduler hands it to the workers: positions, block tables and
        the slot of each scheduled token, from the scheduler's own block tables right after it
        scheduled, slot = block_id * block_size + position % block_size (the rule the model
        runner applies in the worker), rows in scheduling order. The runner's own buffers live
        in worker processes (vLLM's default, on CPU too) or on a GPU, where reading them would
        stall async scheduling; the record's `batch_source: "scheduler"` says so."""
        s, bs = self.scheduler, self.records.block_size
        before = computed_before(out)[0]
        ids, positions, slots, qsl, seq_lens, tables, logits = [], [], [], [0], [], [], []
        rids = list(out.num_scheduled_tokens)
        for rid in rids:
            req, n, b = s.requests[rid], int(out.num_scheduled_tokens[rid]), int(before[rid])
            table = self.table(rid)
            pos = range(b, b + n)
            positions.extend(pos)
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            ids.extend(int(t) for t in req.all_token_ids[b:b + n])
            qsl.append(qsl[-1] + n)
            seq_lens.append(b + n)
            tables.append(table[:(b + n + bs - 1) // bs])
            if b + n >= req.num_tokens:
                logits.append(qsl[-1] - 1)
        return rids, {"input_ids": ids, "positions": positions, "query_start_loc": qsl, "seq_lens": seq_lens,
                      "slot_mapping": slots, "block_tables": tables, "logits_indices": logits}

    # -- one step --------------------------------------------------------------------------------
    def begin_step(self) -> Capture:
        cap = Capture()
        self.join_between(cap)  # what happened between steps (an abort's frees) is told with this step
        self.capture.now = cap
        self.capture._cached_now = set()
        return cap

    def join_between(self, cap: Capture) -> None:
        """Move the events seen outside any step into `cap`."""
        between = self.between
        for k in BLOCK_EVENTS:
            cap.blocks[k].extend(between.blocks[k])
        cap.ref_dropped |= between.ref_dropped
        self.between = Capture()

    def record_step(self, cap: Capture, result: dict) -> dict | None:
        """The step's StepRecord dict (RecordBuilder.step_record, its `changes` not yet in), or
        None when nothing ran."""
        out = cap.out
        self.tracker.note_step(cap)
        outputs = [_Out(o) for eco in (result or {}).values() for o in (eco.outputs or ())]
        finished_now = self.records.finished_now
        if out is None or (not out.num_scheduled_tokens and not outputs and not finished_now):
            return None
        total = time.perf_counter() - getattr(cap, "started", time.perf_counter())
        self.capture.now = cap
        try:
            rec = self.records.step_record(cap, outputs, total)
        finally:
            self.capture.now = self.between
        rec.finished = list(dict.fromkeys(rec.finished + [e.request_id for e in finished_now]))
        # The batch is the scheduler's view of it (see scheduler_batch); None: nobody listened when it was scheduled.
        rec.batch_source = "scheduler" if cap.batch else None
        d = rec.to_dict()
        d["timings_ms"]["backend"] = "vLLM server"
        return d

    def take_finished(self) -> list[RequestState]:
        done = self.records.take_finished()
        for e in done:
            self.finished.append(e)
            self.records.requests.pop(e.request_id, None)
        return done

    def snapshot(self, finished: list[RequestState]) -> dict:
        """The EngineSnapshot dict now, with `finished` as its finished queue (a refresh point:
        the tracker's notes are folded in, and a later step's changes continue from it)."""
        kv, records = self.scheduler.kv_cache_manager, self.records
        with gc_paused():
            running = list(self.scheduler.running)
            tables = {r.request_id: list(kv.get_block_ids(r.request_id)[0]) for r in running}
            queues = records.queues(running, tables, finished)
            pool = self.tracker.whole_pool(running, tables)
            return EngineSnapshot(step=records.step_count, config=self.config_dict, model_info=records.model_info,
                                  metrics=records.metrics, queues=queues, block_pool=pool).to_dict()

    def is_idle(self) -> bool:
        s = self.scheduler
        return not s.running and not s.waiting


class _Publisher:
    """The feed's two sockets. Steps are sent from vLLM's scheduler thread without blocking: an
    XPUB socket (it tells how many subscribe: with none, a step is not even built, only counted
    as `unobserved`) whose per-subscriber queue holds SNDHWM messages; a subscriber that does
    not read loses the messages past it, and only it (ZMQ drops per subscriber). Each message
    carries a sequence number, so every subscriber counts exactly what it missed. Snapshots
    are answered from a small thread with the latest one built."""

    def __init__(self, settings: dict, view: _ServerView) -> None:
        import zmq

        self.zmq = zmq
        self.view = view
        self.tokens = settings["tokens"]
        self.run_id = uuid.uuid4().hex
        self.seq = 0
        self.subscribers = 0
        # recorder_ms: the recorder's own time on vLLM's scheduler thread (building and sending
        # records, outside vLLM's calls; the block-pool hooks' share of those calls is not in it).
        self.counters = {"published": 0, "unobserved": 0, "errors": 0, "steps": 0, "recorder_ms": 0.0,
                         "recorder_cpu_ms": 0.0}
        self._lock = threading.Lock()
        self._latest: bytes | None = None
        self._stale = True
        self._want = threading.Event()
        self._fresh = threading.Condition(self._lock)
        for address in (settings["feed"], settings["snapshot"]):
            if not protocol.is_loopback(address):
                log.warning("kvscope recorder binds %s, which is not a loopback address: the feed carries "
                            "prompts; prefer 127.0.0.1 and an SSH tunnel", address)
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.SNDHWM, settings["hwm"])
        self.pub.setsockopt(zmq.XPUB_VERBOSER, 1)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDBUF, settings["sndbuf"])
        self.pub.bind(settings["feed"])
        self.rep = self.ctx.socket(zmq.REP)
        self.rep.setsockopt(zmq.LINGER, 0)
        self.rep.bind(settings["snapshot"])
        self._running = True
        self._publish_snapshot([])
        self._thread = threading.Thread(target=self._serve, name="kvscope-snapshots", daemon=True)
        self._thread.start()
        log.info("kvscope recorder: run %s, feed %s, snapshots %s, token ids %s", self.run_id, settings["feed"],
                 settings["snapshot"], "on" if self.tokens else "left out")

    def own_time(self, seconds: float, cpu_seconds: float, step: bool = False) -> None:
        self.counters["recorder_ms"] += seconds * 1e3
        self.counters["recorder_cpu_ms"] += cpu_seconds * 1e3  # its CPU time: what other processes cannot inflate
        self.counters["steps"] += step

    def count_subscribers(self) -> None:
        zmq = self.zmq
        while True:
            try:
                frame = self.pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01":
                self.subscribers += 1
            elif frame[:1] == b"\x00":
                self.subscribers = max(0, self.subscribers - 1)

    def step(self, record: dict | None) -> None:
        """After vLLM's update: publish the step (if anyone listens) and keep a fresh snapshot
        for joining clients when one asked or the server went idle."""
        self.count_subscribers()
        view = self.view
        finished = view.take_finished()
        if record is None and not finished:
            return
        self.seq += 1
        if self.subscribers > 0:
            record = record or _empty_record(view)
            # What the step changed, not the whole state: O(what it did), not O(pool + tokens in flight).
            record["changes"] = view.tracker.changes(record["step"], finished)
            msg = {"schema": protocol.SCHEMA_VERSION, "kind": "step", "run_id": self.run_id, "seq": self.seq,
                   "record": record, "counters": dict(self.counters)}
            if not self.tokens:
                protocol.strip_tokens(msg)
            try:  # never blocks: at a subscriber's HWM, ZMQ drops the message for that subscriber only
                self.pub.send_multipart((protocol.TOPIC, protocol.encode(msg)), self.zmq.NOBLOCK)
                self.counters["published"] += 1
            except Exception:  # noqa: BLE001
                self.counters["errors"] += 1
                log.exception("kvscope recorder: publishing failed")
        else:
            self.counters["unobserved"] += 1
            view.tracker.forget(finished)
        with self._lock:
            self._stale = True
        if self._want.is_set() or view.is_idle():
            self._publish_snapshot(list(view.finished))

    def _publish_snapshot(self, finished: list) -> None:
        msg = {"schema": protocol.SCHEMA_VERSION, "kind": "snapshot", "run_id": self.run_id, "seq": self.seq,
               "snapshot": self.view.snapshot(finished), "counters": dict(self.counters)}
        if not self.tokens:
            protocol.strip_tokens(msg)
        data = protocol.encode(msg)
        with self._fresh:
            self._latest, self._stale = data, False
            self._want.clear()
            self._fresh.notify_all()

    def _serve(self) -> None:
        zmq = self.zmq
        poller = zmq.Poller()
        poller.register(self.rep, zmq.POLLIN)
        while self._running:
            try:
                if not poller.poll(200):
                    continue
                request = self.rep.recv()
            except zmq.ZMQError:
                return
            try:
                import msgspec

                ask = msgspec.msgpack.decode(request)
                ok = isinstance(ask, dict) and ask.get("schema") == protocol.SCHEMA_VERSION
            except Exception:  # noqa: BLE001
                ok = False
            if not ok:
                reply = protocol.encode({"schema": protocol.SCHEMA_VERSION, "kind": "error",
                                         "error": f"this recorder speaks kvscope feed schema {protocol.SCHEMA_VERSION}"})
            else:
                with self._fresh:
                    if self._stale:  # steps ran since: ask the scheduler thread for a new one
                        self._want.set()
                        self._fresh.wait_for(lambda: not self._stale, timeout=5.0)
                    reply = self._latest
            try:
                self.rep.send(reply)
            except zmq.ZMQError:
                return

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=1.0)
        self.pub.close(0)
        self.rep.close(0)
        self.ctx.term()


def _empty_record(view: _ServerView) -> dict:
    from engine.report.records import StepRecord

    records = view.records
    records.step_count += 1
    rec = StepRecord(step=records.step_count, wall_time_s=time.time(), engine_time_s=records.engine_time)
    return rec.to_dict()


def _params(request: Any) -> SamplingParams:
    """vLLM's sampling params in kvscope's fields (what the request dict shows)."""
    sp = getattr(request, "sampling_params", None)
    try:
        return SamplingParams(temperature=max(0.0, float(sp.temperature)), top_k=max(0, int(sp.top_k or 0)),
                              top_p=float(sp.top_p) if 0 < float(sp.top_p) <= 1 else 1.0,
                              max_tokens=max(1, int(getattr(request, "max_tokens", None) or sp.max_tokens or 1)),
                              ignore_eos=bool(sp.ignore_eos), stop_token_ids=list(sp.stop_token_ids or ()),
                              seed=sp.seed if sp.seed is None or sp.seed >= 0 else None, logprobs_top=0)
    except Exception:  # noqa: BLE001 - a field kvscope cannot show is not a reason to lose the request
        return SamplingParams(logprobs_top=0)


def _model_info(vc: Any) -> dict:
    from engine.dtypes import dtype_name

    mc = vc.model_config
    hf = mc.hf_config
    heads = int(hf.num_attention_heads)
    tp = int(vc.parallel_config.tensor_parallel_size)
    import vllm

    return {"engine": f"vLLM {vllm.__version__} (live server)", "engine_version": vllm.__version__,
            "name": str(mc.model).rstrip("/").split("/")[-1], "model_path": str(mc.model),
            "architecture": getattr(hf, "model_type", None), "num_layers": int(hf.num_hidden_layers),
            "num_heads": heads, "num_kv_heads": int(getattr(hf, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(hf, "head_dim", None) or hf.hidden_size // heads),
            "hidden_size": int(hf.hidden_size), "vocab_size": int(mc.get_vocab_size()),
            "dtype": dtype_name(mc.dtype), "compute_dtype": dtype_name(mc.dtype),
            "device": str(getattr(vc.device_config, "device_type", "")), "max_model_len": int(mc.max_model_len),
            "attention_backend": None, "cuda_graphs": None,
            "cuda_graphs_off": "enforce_eager" if mc.enforce_eager else None,
            "tensor_parallel_size": tp, "pipeline_parallel_size": int(vc.parallel_config.pipeline_parallel_size),
            "async_scheduling": bool(getattr(vc.scheduler_config, "async_scheduling", False)),
            "kv_bytes_per_block": _kv_bytes_per_block(vc), "live": True}


def _kv_bytes_per_block(vc: Any) -> int:
    """K and V of one block over every layer and KV head (all tensor-parallel ranks together):
    what one block of the pool costs in memory (a what-if turns a memory size into blocks with it)."""
    mc, cc = vc.model_config, vc.cache_config
    hf = mc.hf_config
    heads = int(hf.num_attention_heads)
    kv_heads = int(getattr(hf, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // heads)
    cache_dtype = str(getattr(cc, "cache_dtype", "auto"))
    itemsize = 1 if cache_dtype.startswith("fp8") else int(mc.dtype.itemsize)
    return 2 * int(hf.num_hidden_layers) * kv_heads * head_dim * itemsize * int(cc.block_size)


def _config_dict(vc: Any, s: Scheduler) -> dict:
    mc, sc, cc = vc.model_config, vc.scheduler_config, vc.cache_config
    from engine.dtypes import dtype_name

    return {"model": str(mc.model), "block_size": int(cc.block_size),
            "num_kv_blocks": int(s.kv_cache_manager.block_pool.num_gpu_blocks),
            "max_num_batched_tokens": int(sc.max_num_batched_tokens), "max_num_seqs": int(sc.max_num_seqs),
            "max_model_len": int(mc.max_model_len), "enable_prefix_caching": bool(cc.enable_prefix_caching),
            "enable_chunked_prefill": bool(sc.enable_chunked_prefill), "scheduling_policy": "unified",
            "scheduler_reserve_full_isl": bool(getattr(s, "scheduler_reserve_full_isl", True)),
            # vLLM's own knobs that change its decisions (a recording replays with them).
            "long_prefill_token_threshold": int(sc.long_prefill_token_threshold),
            "long_prefill_token_threshold_adaptive": bool(getattr(sc, "long_prefill_token_threshold_adaptive", False)),
            "policy": str(sc.policy), "prefix_caching_hash_algo": str(cc.prefix_caching_hash_algo),
            "watermark": float(getattr(sc, "watermark", 0.0) or 0.0),
            "max_num_active_seqs": getattr(sc, "max_num_active_seqs", None),
            "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
            "tensor_parallel_size": int(vc.parallel_config.tensor_parallel_size), "dtype": dtype_name(mc.dtype),
            "enforce_eager": bool(mc.enforce_eager), "device": str(getattr(vc.device_config, "device_type", ""))}
