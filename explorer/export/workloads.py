"""Recording a workload for the one-file export: the walkthrough notebook's own story, a
JSON file of requests, or a Python file defining `run(session, caption)`, run on a fresh
Session with a caption per step (`python -m explorer export`)."""
from __future__ import annotations

import inspect
import json
import os
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from engine.report.schema import BudgetsDict

from .page import DEFAULT_MAX_BYTES, DEFAULT_MAX_STEPS, ExportResult, export_html

if TYPE_CHECKING:
    from ..core.session import Session
    from ..core.session_view import SessionView
    from ..ui.panel_views import PoolConfigDict


class WorkloadItemDict(BudgetsDict, total=False):
    """One item of a JSON workload: a request (its prompt and sampling fields) or a budget change (the
    scheduler knobs it sets), and a caption of its own; each may say when it happens."""
    at_step: int            # once the engine has run this many steps (0: before the first)
    caption: str
    prompt: str | list[int]
    request_id: str
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    ignore_eos: bool
    seed: int
    stop_token_ids: list[int]


class WorkloadSpecDict(TypedDict, total=False):
    """A JSON workload file (`run_json_workload` says each field)."""
    title: str
    model: str | None
    config: dict[str, Any]   # EngineConfig's fields, passed on to the Session
    requests: list[WorkloadItemDict]
    budget: list[WorkloadItemDict]
    captions: dict[str, str]   # step -> caption
    max_steps: int


# -- recording workloads ----------------------------------------------------------------------
class Captions:
    """`caption(text)`: a line for the page, shown from the session's current step on."""

    def __init__(self, session: SessionView) -> None:
        self.session = session
        self.items: dict[int, str] = {}

    def __call__(self, text: str) -> None:
        self.items[int(self.session.current.step)] = str(text)


_SAMPLING: tuple[Literal["max_tokens", "temperature", "top_k", "top_p", "ignore_eos", "seed", "stop_token_ids"],
                 ...] = ("max_tokens", "temperature", "top_k", "top_p", "ignore_eos", "seed", "stop_token_ids")
_REQUEST_KEYS = frozenset({"prompt", "at_step", "request_id", "caption", *_SAMPLING})


def run_json_workload(session: Session, spec: WorkloadSpecDict, caption: Callable[[str], None], *,
                      max_steps: int = 10_000) -> None:
    """Run a JSON workload on `session`:

    {"title": "...", "model": null, "config": {EngineConfig fields},
     "requests": [{"prompt": "text" | [token ids], "at_step": 0, "request_id": "a",
                   "max_tokens": 16, "temperature": 0.0, ..., "caption": "..."}],
     "budget": [{"at_step": 5, "max_num_batched_tokens": 32, "caption": "..."}],
     "captions": {"0": "..."}, "max_steps": 500}

    A request (or budget change) with `at_step: k` is added once the engine has run k
    steps (0: before the first); an engine with nothing to do waits for the next arrival
    without recording empty steps. Steps run until every request has arrived and
    finished, or `max_steps`. Bad fields raise ValueError naming them."""
    requests = spec.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ValueError("requests: the workload needs a non-empty list of requests")
    for i, r in enumerate(requests):
        if not isinstance(r, dict) or "prompt" not in r:
            raise ValueError(f"requests[{i}]: each request needs a prompt")
        unknown = set(r) - _REQUEST_KEYS
        if unknown:
            raise ValueError(f"requests[{i}]: unknown field(s) {sorted(unknown)}; known: {sorted(_REQUEST_KEYS)}")
    budget = spec.get("budget") or []
    if not isinstance(budget, list):
        raise ValueError("budget: expected a list of {at_step, knob: value}")
    events: dict[int, list[tuple[str, WorkloadItemDict]]] = {}
    for kind, items in (("request", requests), ("budget", budget)):
        for i, item in enumerate(items):
            at = item.get("at_step", 0)
            if isinstance(at, bool) or not isinstance(at, int) or at < 0:
                raise ValueError(f"{kind}[{i}].at_step: expected an integer >= 0, got {at!r}")
            events.setdefault(at, []).append((kind, item))
    for step, text in (spec.get("captions") or {}).items():
        events.setdefault(int(step), []).append(("caption", {"caption": text}))
    last_arrival = max(events)
    limit = spec.get("max_steps", max_steps)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_steps: expected an integer >= 1, got {limit!r}")
    done = 0
    while done < limit:
        for kind, item in events.pop(done, []):
            if item.get("caption"):
                caption(item["caption"])
            if kind == "request":
                fields: dict[str, Any] = {k: item[k] for k in _SAMPLING if k in item}   # add_request's **sampling
                prompt = item["prompt"]
                session.add_request(list(prompt) if isinstance(prompt, list) else str(prompt),
                                    request_id=item.get("request_id"), **fields)
            elif kind == "budget":
                knobs = {k: v for k, v in item.items() if k not in ("at_step", "caption")}
                if knobs:
                    session.set_budget(**knobs)
        if not session.source.pending():
            if done >= last_arrival:
                break
            done += 1  # idle until the next arrival: nothing to step
            continue
        if not session.step(1):
            break
        done += 1


def walkthrough_story(s: Session, caption: Callable[[str], None]) -> None:
    """The walkthrough notebook's chapters 2-13 on one session (no reset between them).

    The notebook resets to a 6-block pool for preemption; here the 64-block pool runs out
    instead, so the whole story is one history. Chapter 14 (two budget runs) is left out:
    the latency charts show every request's TTFT and ITL anyway."""
    tok = s.source.tokenizer
    bs = s.config.block_size

    def ids(text: str) -> list[int]:
        return list(tok(text)["input_ids"])

    def chat(system: str, question: str) -> str:
        try:
            turns = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - a tokenizer without a chat template: the plain turn
            return f"{system}\n\n{question}\n"

    def second_joins_a_step_later(first: str, second: str, max_tokens: tuple[int, int]) -> None:
        # A step apart: `first`'s prompt is computed by then, so it decodes beside `second`'s prefill
        # and its full blocks are cached for `second` to hit.
        s.add_request(first, max_tokens=max_tokens[0], temperature=0.0)
        s.step(1)
        s.add_request(second, max_tokens=max_tokens[1], temperature=0.0)
        s.run_until_idle()

    caption("Chapters 2-6: one request. Its prefill computes the whole prompt in one step and samples the "
            "first token; each decode step feeds one token and reads the rest from the paged KV cache.")
    s.add_request("The capital of France is", max_tokens=3, temperature=0.0)
    s.run_until_idle()

    caption("Chapters 7-8: a prompt of exactly one block. The first decode lands in a second block; once a block "
            "is full it gets a hash. When the request finishes, its blocks go back last block first.")
    words = ("Paged attention keeps every token's keys and values in fixed-size blocks, so a sequence "
             "grows one block at a time and never needs one long contiguous buffer.")
    s.add_request(ids(words)[:bs], max_tokens=4, temperature=0.0)
    s.run_until_idle()

    caption("Chapter 9: two requests in one step. One decodes while the other prefills: one packed batch, "
            "one forward pass (see query_start_loc and logits_indices in the slot mapping).")
    second_joins_a_step_later("Write a haiku about the sea.", "Name three primary colors.", max_tokens=(4, 3))

    caption("Chapter 10: a prefix-cache hit. The second chat prompt shares the first one's system prompt: it is "
            "admitted with those full blocks already computed (refcount 2, two owners).")
    system = ("You are a careful and patient geography tutor for students. Answer every question with one short "
              "sentence that names the city. Do not explain the answer and do not repeat the question.")
    second_joins_a_step_later(chat(system, "What is the capital of France?"),
                              chat(system, "What is the capital of Italy?"), max_tokens=(10, 10))

    caption("Chapter 11: three requests with one system prompt arrive together. Blocks are hashed when "
            "allocated, so the second and third hit blocks the first computes in this same step.")
    guide = ("You are a museum guide who loves old paintings. Reply to each visitor with one short sentence "
             "that names the painter. Never add anything else.")
    for q in ("Who painted the Mona Lisa?", "Who painted The Starry Night?", "Who painted The Night Watch?"):
        s.add_request(chat(guide, q), max_tokens=12, temperature=0.0)
    s.run_until_idle()

    caption("Chapter 12: chunked prefill. With a budget of 64 tokens a 150-token prompt is computed in chunks "
            "of 64, 64 and 22 tokens, one per step; only the last chunk is sampled.")
    s.set_budget(max_num_batched_tokens=64)
    facts = " ".join(f"Fact {i}: one block of the KV cache holds the keys and values of sixteen tokens."
                     for i in range(1, 16))
    s.add_request(ids(facts)[:150], max_tokens=2, temperature=0.0)
    s.run_until_idle()
    s.set_budget(max_num_batched_tokens=2048)

    caption("Chapter 13: preemption. Four prompts of 15 blocks each fill the pool; when they all need a 16th "
            "block there is none, and the newest running request is preempted (its blocks freed, recomputed later).")
    unit = ids("Tell me a long story about a lighthouse keeper and the ships that pass in the night. ")
    total = s.current.snapshot["block_pool"]["num_blocks"] - 1   # the engine's pool: config.num_kv_blocks
    per = max(1, min(15, (total - 4) // 4))
    for i in range(4):
        prompt = (unit * (per * bs // max(1, len(unit)) + 2))[i:i + per * bs]
        s.add_request(prompt, request_id=f"burst-{i}", max_tokens=bs + 4, ignore_eos=True, temperature=0.0)
    s.run_until_idle()
    caption("The end of the story: scrub back through any step, hover a block for its tokens and hash, "
            "click a timeline bar to jump there.")


WALKTHROUGH_CONFIG: PoolConfigDict = {"block_size": 16, "num_kv_blocks": 64}


def record_workload(workload: str | Path = "walkthrough", *, model: str | None = None,
                    config: PoolConfigDict | None = None,
                    progress: Callable[[str], None] | None = None) -> tuple[Session, dict[int, str], str]:
    """Build a Session, run `workload` on it; returns (session, captions, title).

    `workload`: "walkthrough" (the notebook's story), a .json file (`run_json_workload`)
    or a .py file defining `run(session, caption)` (optionally `CONFIG`, `MODEL`, `TITLE`)."""
    from ..core.session import Session

    say = progress or (lambda _line: None)
    spec_config: dict[str, Any]   # EngineConfig's fields, passed on to the Session
    if str(workload) == "walkthrough":
        spec_config, spec_model, title = dict(WALKTHROUGH_CONFIG), None, "kvscope: the walkthrough's story"
        runner: Callable[[Session, Captions], None] = walkthrough_story
    else:
        path = Path(workload)
        if not path.is_file():
            raise ValueError(f"workload: no such file {str(path)!r} (give a .json or .py file, or 'walkthrough')")
        if path.suffix == ".json":
            try:
                spec = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"workload: {path} is not valid JSON: {exc}") from None
            if not isinstance(spec, dict):
                raise ValueError("workload: the JSON file must hold an object with a 'requests' list")
            # A workload file's object: run_json_workload checks each field it reads, naming a wrong one.
            workload_spec = cast(WorkloadSpecDict, spec)
            spec_config, spec_model = dict(spec.get("config") or {}), spec.get("model")
            title = str(spec.get("title") or f"kvscope recording: {path.stem}")

            def runner(session: Session, caption: Captions) -> None:
                run_json_workload(session, workload_spec, caption)
        elif path.suffix == ".py":
            namespace = runpy.run_path(str(path), run_name="kvscope_workload")
            if not callable(namespace.get("run")):
                raise ValueError(f"workload: {path} must define run(session, caption)")
            spec_config, spec_model = dict(namespace.get("CONFIG") or {}), namespace.get("MODEL")
            title = str(namespace.get("TITLE") or f"kvscope recording: {path.stem}")
            run = namespace["run"]
            try:
                takes_caption = len(inspect.signature(run).parameters) >= 2
            except (TypeError, ValueError):
                takes_caption = True

            def runner(session: Session, caption: Captions) -> None:
                run(session, caption) if takes_caption else run(session)
        else:
            raise ValueError(f"workload: expected a .json or .py file, got {path.name!r}")
    spec_config.update({k: v for k, v in (config or {}).items() if v is not None})
    say(f"[kvscope] loading the model ({model or spec_model or 'default: SmolLM2-135M-Instruct'}) ...")
    # That line is the load's progress: the engine's own weights bar would draw over the next one.
    quiet = os.environ.get("KVSCOPE_QUIET")
    os.environ["KVSCOPE_QUIET"] = "1"
    try:
        session = Session(model or spec_model, **spec_config)
    finally:
        if quiet is None:
            del os.environ["KVSCOPE_QUIET"]
        else:
            os.environ["KVSCOPE_QUIET"] = quiet
    captions = Captions(session)
    say(f"[kvscope] recording {'the walkthrough story' if str(workload) == 'walkthrough' else workload} ...")
    runner(session, captions)
    say(f"[kvscope] recorded {session.current.step} steps")
    return session, captions.items, title


def run_export(output: str | Path, workload: str | Path = "walkthrough", *, model: str | None = None,
               config: PoolConfigDict | None = None, max_steps: int = DEFAULT_MAX_STEPS, keep: str = "last",
               title: str | None = None, start: str = "last", max_bytes: int = DEFAULT_MAX_BYTES,
               progress: Callable[[str], None] | None = print) -> ExportResult:
    """`python -m explorer export`: record `workload`, write the page, say what it weighs."""
    say = progress or (lambda _line: None)
    session, captions, default_title = record_workload(workload, model=model, config=config, progress=say)
    result = export_html(session, output, title=title or default_title, captions=captions, max_steps=max_steps,
                         keep=keep, start=start, max_bytes=max_bytes)
    say(f"[kvscope] wrote {result.path} ({result.bytes / 1e6:.2f} MB, {result.steps_included - 1} steps"
        f"{'; ' + result.notice if result.notice else ''})")
    say(f"[kvscope] open it in a browser: file://{result.path.resolve()}")
    return result
