"""A recording replayed through kvscope's own core (engine.token_replay.TokenReplayEngine): the
engine's scheduler, KV cache manager and block pool, with the recorded output tokens in the
model's place. Unlike `replay` (vLLM's scheduler, decisions only), it keeps every step's record
and snapshot, so the panels can show the run; and it needs neither torch, numpy nor vLLM, so a
docs page runs it in the reader's browser (Pyodide).

    run = core_replay(rec, core_variant(rec, num_blocks=12), model_info=info)
    run.entries      # HistoryEntry per step, the state before the first included
    run.result       # a ReplayResult with every step's detail, as `replay(keep_steps=True)` gives
    run.stopped      # why it ended before every request finished ('' when none is left)

Requests arrive before the schedule() of their recorded arrival step, and one aborted outside a
step is aborted before the same step (`replay`'s arrivals="step"); so do the scheduler knobs the
recorded run changed between steps (`knob_changes`), but those the variant sets. A request that ended by itself
is given max_tokens = its recorded output length, so it ends at the same token whatever the
settings; one the recording left running ends the replay when it has used its recorded tokens
(what it would say next is not known), and one aborted later than its recorded tokens reach is
fed its last prompt token, as `replay` does.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.kv_cache_groups import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    attention_group_specs,
    parse_group_kinds,
)
from engine.report.schema import QUEUE, REC, SCHED, SNAP, ModelInfoDict
from engine.sampling_params import SamplingParams
from engine.token_replay import TokenReplayEngine, TokensUsedUp

from ..core.history import HistoryEntry
from ..core.recording import RecordedRequest, Recording, Settings, decisions_digest, step_decisions, step_work
from .replay import (
    Preemption,
    ReplayError,
    ReplayResult,
    RequestResult,
    StepDetail,
    account_step,
)
from .settings import SettingRejected, SettingValue, Variant

# What a replay through kvscope's core may change (vLLM's names, as `variant`'s).
CORE_KNOBS = ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
              "enable_chunked_prefill")


def core_variant(rec: Recording, **changes: SettingValue) -> Variant:
    """The recording's settings with `changes` (CORE_KNOBS), checked as kvscope's engine checks
    its config (SettingRejected names the setting). A new block size without num_blocks keeps the
    recorded pool's memory, as `variant` does."""
    unknown = set(changes) - set(CORE_KNOBS)
    if unknown:
        raise SettingRejected(f"unknown setting(s) {sorted(unknown)} for a replay through kvscope's core; "
                              f"known: {list(CORE_KNOBS)}")
    base = rec.settings
    fields = {k: v for k, v in changes.items() if v is not None}
    note = ""
    if "num_blocks" not in fields and fields.get("block_size", base.block_size) != base.block_size:
        block_size = fields["block_size"]
        if isinstance(block_size, int) and not isinstance(block_size, bool) and block_size > 0:
            fields["num_blocks"] = max(2, (base.num_blocks * base.block_size) // block_size)
            note = f"{fields['num_blocks']} blocks, the same memory"
    settings = base.replace(**fields)
    engine_config(settings)   # refuses what kvscope's engine refuses
    changed = tuple((k, v) for k, v in changes.items() if v is not None and getattr(base, k) != v)
    return Variant(settings, changed, note if changed else "")


def engine_config(s: Settings) -> EngineConfig:
    """kvscope's EngineConfig for recorded Settings (SettingRejected: a setting its core lacks or refuses)."""
    if s.policy != "fcfs":
        raise SettingRejected(f"policy {s.policy!r}: kvscope's core schedules first come first served only")
    for name in ("long_prefill_token_threshold", "watermark"):
        if getattr(s, name):
            raise SettingRejected(f"{name}={getattr(s, name)!r}: kvscope's core has no such knob (0 only)")
    try:
        return EngineConfig(block_size=s.block_size, num_kv_blocks=s.num_blocks,
                            max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                            max_model_len=s.max_model_len, enable_prefix_caching=s.enable_prefix_caching,
                            enable_chunked_prefill=s.enable_chunked_prefill,
                            scheduler_reserve_full_isl=s.scheduler_reserve_full_isl,
                            prefix_cache_retention_interval=s.prefix_cache_retention_interval)
    except ValueError as exc:
        raise SettingRejected(_our_names(exc)) from None


def core_groups(s: Settings) -> list[KVCacheSpec] | None:
    """The KV cache groups kvscope's core builds for recorded Settings (None: one full-attention
    group): the full-attention group, then a sliding-window or a Mamba one (ReplayError: a model
    of other groups, such as a Gemma 3's several sliding groups, which vLLM's scheduler replays)."""
    if s.kv_cache_groups is None:
        return attention_group_specs(s.sliding_window)
    if parse_group_kinds(s.kv_cache_groups) == ["full", "mamba"]:
        return [FullAttentionSpec(), MambaSpec()]
    raise ReplayError(f"kvscope's core runs a full-attention group and at most one sliding-window or Mamba group, "
                      f"in that order; this recording's model had {s.kv_cache_groups!r}: replay it through vLLM's "
                      f"scheduler")


def _our_names(exc: Exception) -> str:
    """The engine's message in the recording's names (its num_kv_blocks is num_blocks here)."""
    return str(exc).replace("num_kv_blocks", "num_blocks")


@dataclass
class CoreReplay:
    """A replay through kvscope's core: the history the panels read, and the what-if's result."""

    entries: list[HistoryEntry]
    result: ReplayResult
    stopped: str = ""    # why it ended with requests unfinished ('' when none was left)
    requests: dict[str, RecordedRequest] = field(default_factory=dict)


def core_replay(rec: Recording, v: Variant | None = None, *, model_info: ModelInfoDict | None = None,
                decode: Callable[[Sequence[int]], str] | None = None, max_steps: int | None = None,
                knob_changes: Mapping[int, Mapping[str, SettingValue]] | None = None) -> CoreReplay:
    """Replay `rec` at `v` (default: its own settings) through kvscope's core (see the module doc).
    `knob_changes`: step -> the scheduler knobs the recorded run changed just before it (a
    Session's set_budget); each applies here too, but for a knob `v` changes, which holds throughout."""
    v = v or core_variant(rec)
    if any(r.arrival_step is None for r in rec.requests):
        raise ReplayError("a trace without arrival steps cannot be replayed step by step")
    eng = TokenReplayEngine(engine_config(v.settings), model_info or {}, kv_cache_groups=core_groups(v.settings),
                            decode=decode)
    held = {k for k, _ in v.changed}
    knobs = {int(step): {k: x for k, x in changed.items() if k not in held}
             for step, changed in (knob_changes or {}).items()}
    return _CoreReplay(rec, v, eng, max_steps, {step: k for step, k in knobs.items() if k}).run()


class _CoreReplay:
    def __init__(self, rec: Recording, v: Variant, eng: TokenReplayEngine, max_steps: int | None,
                 knobs: dict[int, dict[str, SettingValue]]) -> None:
        self.rec, self.v, self.eng, self.knobs = rec, v, eng, knobs
        self.result = ReplayResult(variant=v, arrivals="step")
        self.pending = sorted(rec.requests, key=lambda r: (r.arrival_step or 0, r.arrival_seq))
        self.aborts = rec.aborted_before()
        # Steps the recording ran with nothing to do (a Session stepped while idle): run them too.
        steps = rec.steps
        self.empty_steps = {n for n, pf, dc in zip(steps.step, steps.prefill_tokens, steps.decode_requests)
                            if not pf and not dc}
        self.limit = max_steps or (20 * max(len(rec.steps), 1) + 20 * sum(
            len(r.prompt_token_ids) + len(r.output_token_ids) for r in rec.requests) + 1000)

    def _add(self, r: RecordedRequest) -> None:
        n_out = len(r.output_token_ids)
        tokens = list(r.output_token_ids)
        eos = None
        if r.ends_by_itself:   # the same last token ends it
            max_tokens = max(1, n_out)
            if r.finish_reason == "stop" and not r.ignore_eos and tokens and tokens[-1] not in r.stop_token_ids:
                eos = tokens[-1]   # the model's end-of-sequence token: not in the recording's stop ids
        else:
            max_tokens = max(r.max_tokens, n_out)
            if r.finish_reason is not None:   # aborted: past its recorded tokens, its last prompt token
                tokens += [r.prompt_token_ids[-1]] * (max_tokens - n_out)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=r.ignore_eos,
                                stop_token_ids=list(r.stop_token_ids))
        try:
            self.eng.add_request(r.prompt_token_ids, params, r.request_id, tokens, eos_token_id=eos)
        except ValueError as exc:
            raise SettingRejected(f"{self.v.label}: request {r.request_id!r} cannot run: {_our_names(exc)}") from None
        self.result.requests[r.request_id] = RequestResult(r.request_id, arrival=float(r.arrival_step or 0),
                                                           seen_step=self.eng.step_count + 1)

    def run(self) -> CoreReplay:
        eng, res, rec = self.eng, self.result, self.rec
        t0 = time.perf_counter()
        eng.step_count = rec.source.first_step
        entries = [HistoryEntry(eng.step_count, None, eng.snapshot().to_dict())]
        stopped, p = "", 0
        while p < len(self.pending) or eng.has_unfinished_requests():
            nxt = eng.step_count + 1
            if not eng.has_unfinished_requests() and nxt not in self.empty_steps:
                # Idle, and the recording ran no empty step here: the numbering jumps to the next arrival.
                eng.step_count = max(eng.step_count, (self.pending[p].arrival_step or 0) - 1)
                nxt = eng.step_count + 1
            changed = nxt in self.knobs
            if changed:
                try:
                    eng.update_scheduler_config(**self.knobs[nxt])
                except ValueError as exc:
                    raise SettingRejected(f"{self.v.label}: before step {nxt} the recorded run set {self.knobs[nxt]}, "
                                          f"which these settings refuse: {_our_names(exc)}") from None
            while p < len(self.pending) and (self.pending[p].arrival_step or 0) <= nxt:
                self._add(self.pending[p])
                p, changed = p + 1, True
            for rid in sorted(self.aborts.get(nxt, ())):
                if eng.requests[rid].finish_reason is None:
                    eng.abort_request(rid)
                    changed = True
            if changed:   # as a Session shows it: the latest entry holds what was added or aborted since
                last = entries[-1]
                snap = eng.snapshot().to_dict()
                entries[-1:] = [HistoryEntry(last.step, last.record, snap)] if last.step == eng.step_count else \
                    [last, HistoryEntry(eng.step_count, None, snap)]
            if not eng.has_unfinished_requests() and nxt not in self.empty_steps:
                continue
            if len(res.steps) >= self.limit:
                raise ReplayError(f"{self.v.label}: no end after {self.limit} steps: a request may never fit this pool")
            try:
                entries.append(self._step())
            except TokensUsedUp as used:   # only a request the recording left unfinished runs out
                stopped = (f"stopped before step {nxt}: request {used.request_id!r} was still running when the "
                           f"recording ended, and here it would say more than its {used.num_given} recorded tokens")
                break
        res.seconds = time.perf_counter() - t0
        return CoreReplay(entries, res, stopped, {r.request_id: r for r in rec.requests})

    def _step(self) -> HistoryEntry:
        eng, res = self.eng, self.result
        out_running = {r.request_id: r.num_computed_tokens for r in eng.scheduler.running}
        record = eng.step().to_dict()
        snap = eng.snapshot().to_dict()
        step = record[REC.STEP]
        before = {s[SCHED.REQUEST_ID]: int(s[SCHED.NUM_COMPUTED_BEFORE]) for s in record[REC.SCHEDULED]}
        admitted = set(record[REC.NEW_REQUESTS])
        sampled = list(record[REC.SAMPLED])
        finished = [rid for rid in record[REC.FINISHED] if rid in record[REC.SAMPLED]]
        preemptions = [Preemption(victim, eng.preempted_for.get(victim), out_running.get(victim, 0))
                       for victim in record[REC.PREEMPTED]]
        account_step(res, step, preemptions, before, admitted, sampled, finished, float(step))
        res.query_tokens += sum(eng.requests[rid].num_prompt_tokens for rid in admitted
                                if res.requests[rid].first_scheduled_step == step)
        prefill, decode, context = step_work(record)
        queues = snap[SNAP.QUEUES]
        decisions = step_decisions(record, queues[QUEUE.RUNNING], self.aborts.get(step + 1, ()))
        res.steps.append(step)
        res.times.append(float(step))
        res.scheduled_tokens.append(sum(int(s[SCHED.NUM_TOKENS]) for s in record[REC.SCHEDULED]))
        res.prefill_tokens.append(prefill)
        res.decode_requests.append(decode)
        res.context_tokens.append(context)
        res.num_running.append(len(queues[QUEUE.RUNNING]))
        res.num_waiting.append(len(queues[QUEUE.WAITING]))
        res.kv_usage.append(float(eng.kv.pool.usage))
        res.num_preempted.append(len(preemptions))
        res.digests.append(decisions_digest(decisions))
        res.details.append(StepDetail(
            step=step, decisions=decisions, preemptions=preemptions,
            waiting=[r["request_id"] for r in queues[QUEUE.WAITING]], free_blocks=int(eng.kv.pool.num_free_blocks),
            budget_left=int(eng.config.max_num_batched_tokens - res.scheduled_tokens[-1]), time=None))
        return HistoryEntry(step, record, snap)
