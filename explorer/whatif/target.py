"""The operator's question: which is the cheapest setting whose replay meets my targets?

    res = sweep(rec, target="ttft_p90<=0.3,preemptions==0", max_num_batched_tokens=[64, 128])
    print(res.answer.sentence)   # the smallest pool (in KV memory) that meets both, and the one below it that misses

A target is a few conditions on a sweep row's metrics (`parse_target`). The search looks for the
boundary along one knob, the pool size (`num_blocks`) or the token budget
(`max_num_batched_tokens`), at every combination of the other knobs the sweep lists: it replays
both ends of the range, then splits the interval in which "misses" turns to "meets" at as many
points as there are processes (bisection on one), until the two neighbours are found. That
assumes more of the knob never turns a met target into a missed one; the answer names the
neighbour below it that was replayed and missed, so the boundary is shown, not assumed, and
every replay it ran is a row of the sweep. Of the combinations, the answer is the one with the
least KV memory (then the smallest searched value).
"""
from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias, get_args

from ..core.recording import Recording, Settings
from .settings import SettingRejected, SettingValue, Variant, kv_bytes_per_token, variant

if TYPE_CHECKING:
    from .rows import SweepRowDict

SearchKnob = Literal["num_blocks", "max_num_batched_tokens"]
SEARCH_KNOBS: tuple[SearchKnob, ...] = get_args(SearchKnob)
# What a target may bound: a sweep row's figures (the latencies are the step model's predictions).
TargetMetric = Literal["hit_tokens", "hit_rate", "preemptions", "recomputed_tokens", "max_waiting", "mean_waiting",
                       "max_kv_usage", "mean_kv_usage", "steps", "ttft_p50", "ttft_p90", "itl_p50", "itl_p90",
                       "e2e_p50", "e2e_p90"]
TARGET_METRICS: tuple[TargetMetric, ...] = get_args(TargetMetric)
PREDICTED = frozenset(m for m in TARGET_METRICS if m.split("_")[0] in ("ttft", "itl", "e2e"))
_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge, "==": operator.eq,
                                                   "<": operator.lt, ">": operator.gt}
_CONDITION = re.compile(r"^\s*([a-z_0-9]+)\s*(<=|>=|==|<|>)\s*([0-9.eE+-]+)\s*(ms|s|%)?\s*$")


@dataclass(frozen=True)
class Condition:
    """One target: `metric op value` (seconds for latencies, a fraction for rates)."""

    metric: TargetMetric
    op: str
    value: float

    def holds(self, row: SweepRowDict) -> bool:
        got = row.get(self.metric)
        return got is not None and _OPS[self.op](got, self.value)

    @property
    def text(self) -> str:
        return f"{self.metric} {self.op} {_show(self.metric, self.value)}" + (
            " (predicted)" if self.metric in PREDICTED else "")


def parse_target(spec: str | Mapping[str, tuple[str, float]] | tuple[Condition, ...] | list[Condition]
                 ) -> tuple[Condition, ...]:
    """'ttft_p90<=0.3,preemptions==0' (latencies in seconds, or with ms; rates as 0.2 or 20%), or
    {"ttft_p90": ("<=", 0.3)}: the conditions, each checked (a bad one raises ValueError naming it)."""
    if isinstance(spec, Mapping):
        spec = ",".join(f"{k}{op}{v}" for k, (op, v) in spec.items())
    if not isinstance(spec, str):
        return tuple(spec)
    out = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = _CONDITION.match(part)
        if not m:
            raise ValueError(f"target {part!r}: expected METRIC OP NUMBER, OP one of {list(_OPS)} "
                             "(e.g. 'ttft_p90<=0.3,preemptions==0')")
        metric, op, number, unit = m.groups()
        if metric not in TARGET_METRICS:
            raise ValueError(f"target {part!r}: unknown metric {metric!r}; known: {list(TARGET_METRICS)}")
        try:
            value = float(number)
        except ValueError:
            raise ValueError(f"target {part!r}: {number!r} is not a number") from None
        value = value / 1e3 if unit == "ms" else value / 100 if unit == "%" else value
        out.append(Condition(metric, op, value))
    if not out:
        raise ValueError("target is empty: give at least one condition, e.g. 'ttft_p90<=0.3,preemptions==0'")
    return tuple(out)


def _show(metric: str, value: float) -> str:
    if metric in PREDICTED:
        return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"
    if "rate" in metric or "usage" in metric:
        return f"{value:.1%}"
    return f"{value:g}"


def meets(target: tuple[Condition, ...], row: SweepRowDict) -> bool:
    return row.get("status") == "ok" and all(c.holds(row) for c in target)


def misses_text(target: tuple[Condition, ...], row: SweepRowDict) -> str:
    """What a row misses, in a few words ("preemptions 2", "ttft_p90 410 ms", or why it did not run)."""
    if row.get("status") != "ok":
        return f"{row.get('status')}: {row.get('error')}"
    return ", ".join(f"{c.metric} {_show(c.metric, got)}" if (got := row.get(c.metric)) is not None
                     else f"{c.metric} unknown" for c in target if not c.holds(row))


def bounds(rec: Recording, knob: str, s: Settings) -> tuple[int, int]:
    """The range worth searching: from the least vLLM accepts to where more changes nothing
    (a pool that holds every request's tokens at once; a budget that fits every running
    request's whole prompt)."""
    longest = [min(s.max_model_len, len(r.prompt_token_ids) + max(r.max_tokens, len(r.output_token_ids) + 1))
               for r in rec.requests]
    if knob == "num_blocks":
        lo = -(-s.max_model_len // s.block_size) + 1
        return lo, max(lo, 1 + sum(-(-n // s.block_size) for n in longest))
    if knob == "max_num_batched_tokens":
        lo = s.max_num_seqs if s.enable_chunked_prefill else max(s.max_num_seqs, s.max_model_len)
        prompts = sorted((len(r.prompt_token_ids) for r in rec.requests), reverse=True)[:s.max_num_seqs]
        return lo, max(lo, sum(prompts) + s.max_num_seqs)
    raise ValueError(f"search must be one of {SEARCH_KNOBS}, got {knob!r}")


@dataclass
class Found:
    """One combination of the other knobs: the least value of the searched knob that meets the
    target (None: none in range), and the replayed neighbour below it that misses."""

    fixed: dict[str, SettingValue]   # the other knobs' values (explorer.whatif.sweep.grid's combination)
    base: Settings
    lo: int
    hi: int
    best: SweepRowDict | None = None
    below: SweepRowDict | None = None
    reason: str = ""


@dataclass
class Answer:
    """The search's result: per combination what it found, and the cheapest of them."""

    target: tuple[Condition, ...]
    knob: SearchKnob
    found: list[Found]
    replays: int
    kv_bytes_per_token: float | None
    refused: list[str] = field(default_factory=list)

    @property
    def best(self) -> Found | None:
        hits = [(f.best["kv_tokens"], f.best["settings"][self.knob], self._margin(f.best), len(f.best["changes"]), i)
                for i, f in enumerate(self.found) if f.best is not None]
        return self.found[min(hits)[-1]] if hits else None

    def _margin(self, row: SweepRowDict) -> float:
        """Between settings of the same memory: the one furthest inside the first target wins
        (then the one nearest the recorded settings)."""
        c = self.target[0]
        got = float(row.get(c.metric) or 0.0)
        return got - c.value if c.op in ("<=", "<", "==") else c.value - got

    @property
    def sentence(self) -> str:
        wants = " and ".join(c.text for c in self.target)
        n = len(self.found)
        tried = f"searched at {n} setting{'s' if n != 1 else ''} of the other knobs in {self.replays} replays"
        f = self.best
        if f is None:
            misses = "; ".join(f"{_setting(g.below)}: {g.reason}" for g in self.found if g.below) or "; ".join(
                self.refused) or "nothing ran"
            return f"No setting searched meets {wants} ({tried}). At the top of each range: {misses}."
        assert f.best is not None
        below = (f"; {_knob_value(self.knob, f.below)} misses it ({misses_text(self.target, f.below)})"
                 if f.below is not None else f" (the bottom of the {self.knob} range searched, {f.lo})")
        return (f"The cheapest setting that meets {wants}: {_setting(f.best)}, "
                f"{memory_text(f.best, self.kv_bytes_per_token)}{below}; {tried}.")


def _knob_value(knob: SearchKnob, row: SweepRowDict) -> str:
    v = row["settings"][knob]
    return f"{v} blocks" if knob == "num_blocks" else f"a budget of {v} tokens"


def _setting(row: SweepRowDict) -> str:
    s = row["settings"]
    return (f"{s['num_blocks']} blocks of {s['block_size']} tokens, a budget of {s['max_num_batched_tokens']} tokens, "
            f"max_num_seqs {s['max_num_seqs']}")


def memory_text(row: SweepRowDict, per_token: float | None) -> str:
    tokens = row["kv_tokens"]
    if per_token is None:
        return f"{tokens:,} tokens of KV"
    return f"{tokens:,} tokens = {tokens * per_token / 2**20:,.1f} MiB of KV"


# Replays a list of (row index, variant), returning their rows (explorer.whatif.sweep's replays).
Runner: TypeAlias = "Callable[[list[tuple[int, Variant]]], list[SweepRowDict]]"


def search(rec: Recording, target: tuple[Condition, ...], knob: str, combos: list[dict[str, SettingValue]],
           run: Runner, known: dict[Settings, SweepRowDict], *, span: tuple[int, int] | None = None, width: int = 1,
           first_index: int = 0) -> Answer:
    """Find, for every combination in `combos`, the least `knob` meeting `target`. `run` replays
    a list of (row index, variant) and returns their rows; `known` holds rows already replayed
    (by settings) and gains every new one; `width` is how many points a round may replay."""
    if knob not in SEARCH_KNOBS:
        raise ValueError(f"search must be one of {SEARCH_KNOBS}, got {knob!r}")
    index = [first_index]
    refused: list[str] = []
    found: list[Found] = []
    for fixed in combos:
        try:
            base = variant(rec, **fixed).settings
        except SettingRejected as exc:
            refused.append(f"{fixed}: {exc}")
            continue
        lo, hi = span or bounds(rec, knob, base)
        found.append(Found(fixed=fixed, base=base, lo=lo, hi=hi))
    replays_before = len(known)

    def rows_at(points: list[tuple[Found, int]]) -> dict[tuple[int, int], SweepRowDict]:
        """Replay each (combination, value) not yet known; every row, by (combination, value)."""
        want: list[tuple[int, Variant]] = []
        keys: dict[tuple[int, int], Settings | SweepRowDict] = {}
        for f, value in points:
            try:
                v = variant(rec, **{**f.fixed, knob: value})
            except SettingRejected as exc:
                keys[(id(f), value)] = {"status": "rejected", "error": str(exc),
                                        "settings": f.base.replace(**{knob: value}).to_dict()}
                continue
            keys[(id(f), value)] = v.settings
            if v.settings not in known and all(v.settings != w.settings for _, w in want):
                want.append((index[0], v))
                index[0] += 1
        for row in run(want):
            row["searched"] = True
            known[_settings_of(row)] = row
        return {k: (known[s] if isinstance(s, Settings) else s) for k, s in keys.items()}

    ends = rows_at([(f, x) for f in found for x in (f.lo, f.hi)])
    active = []
    for f in found:
        low, high = ends[(id(f), f.lo)], ends[(id(f), f.hi)]
        if meets(target, low):
            f.best = low
        elif not meets(target, high):
            f.below, f.reason = high, misses_text(target, high)
        else:
            f.best, f.below = high, low
            active.append(f)
    while active:
        per = max(1, width // len(active))
        points = []
        for f in active:
            a, b = _at(f.below, knob), _at(f.best, knob)
            inside = sorted({a + (b - a) * (i + 1) // (per + 1) for i in range(per)} - {a, b})
            points += [(f, x) for x in inside]
        got = rows_at(points)
        for f, x in points:
            row = got[(id(f), x)]
            if meets(target, row) and x < _at(f.best, knob):
                f.best = row
        for f, x in points:  # the largest miss below the (new) least meeting value
            row = got[(id(f), x)]
            if not meets(target, row) and _at(f.below, knob) < x < _at(f.best, knob):
                f.below = row
        active = [f for f in active if _at(f.best, knob) - _at(f.below, knob) > 1]
    return Answer(target=target, knob=knob, found=found, replays=len(known) - replays_before,
                  kv_bytes_per_token=kv_bytes_per_token(rec), refused=refused)


def _at(row: SweepRowDict | None, knob: SearchKnob) -> int:
    """The searched knob's value in one end of a combination still searched (it has both ends)."""
    assert row is not None
    return row["settings"][knob]


def _settings_of(row: SweepRowDict) -> Settings:
    return Settings(**row["settings"])
