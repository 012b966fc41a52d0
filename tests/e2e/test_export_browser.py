"""An exported recording in Debian chromium, opened from file:// with the network blocked:
scrubbing shows an earlier step in the queues, the block pool and the slot mapping, a
hovered block shows its tooltip, the panels' models hold what explorer/ui/views.py gives for
the shown step (the page computes no view of its own), and not one request leaves the file."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from explorer.export import page as export
from explorer.export import workloads as recording
from explorer.ui import views, why_view
from explorer.ui.captions import history_captions
from explorer.why import WhyLedger
from tests.e2e.block_pool import hover_block
from widgets.hover import block_detail

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = {"num_kv_blocks": 12, "block_size": 16, "max_num_batched_tokens": 64}
SHARED = list(range(1000, 1032))
# Three prompts of three blocks that grow to four: the 11 usable blocks run out and the
# newest running request is preempted; a fourth shares two blocks with the first.
SPEC = {
    "requests": [
        *({"prompt": [500 + 7 * i + k for k in range(40)], "max_tokens": 20, "ignore_eos": True,
           "request_id": f"r{i}"} for i in range(3)),
        {"prompt": [*SHARED, 7, 8, 9], "max_tokens": 4, "at_step": 1, "request_id": "10",
         "caption": "request 10 arrives"},
        {"prompt": [*SHARED, 4, 5], "max_tokens": 4, "at_step": 3, "request_id": "2"},
    ],
    "captions": {"0": "three requests arrive"},
}
READY_MS = 60_000


@pytest.fixture(scope="module")
def recorded(tiny_qwen3_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from explorer import Session

    session = Session(str(tiny_qwen3_path), **CONFIG)
    captions = recording.Captions(session)
    recording.run_json_workload(session, SPEC, captions)
    folder = tmp_path_factory.mktemp("export")
    result = export.export_html(session, folder / "run.html", captions=captions.items)
    short = export.export_html(session, folder / "short.html", max_steps=5)
    return {"session": session, "path": result.path, "short": short.path, "captions": captions.items,
            "texts": views.token_texts(session.engine.tokenizer)}


class Offline:
    """Every request that is not the file itself is aborted and counted."""

    def __init__(self, page) -> None:
        self.blocked: list[str] = []
        self.seen: list[str] = []
        page.context.route("**/*", self._route)
        page.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:")) else self.seen.append(r.url))

    def _route(self, route) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()


def open_export(page, path: Path) -> Offline:
    net = Offline(page)
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready=true]", timeout=READY_MS)
    return net


def shown_steps(page) -> set[str]:
    return set(page.eval_on_selector_all(".kvs-panel", "ps => ps.map(p => p.dataset.step)"))


def scrub(page, index: int) -> None:
    page.eval_on_selector('[data-testid="kvs-history-slider"]',
                          "(el, i) => { el.value = String(i); el.dispatchEvent(new Event('input')); }", index)


def test_scrub_back_hover_a_block_and_nothing_leaves_the_file(page, recorded) -> None:
    s = recorded["session"]
    history = s.history
    net = open_export(page, recorded["path"])
    last = history[-1].step
    assert shown_steps(page) == {str(last)}
    # An earlier step with a preemption: several requests, blocks changing hands.
    k = next(e.step for e in history if e.record and e.record["preempted"])
    assert 0 < k < last
    entry = s.entry(k)
    show(page, k)
    assert page.get_attribute('[data-testid="kvs-controls"]', "data-live") == "false"
    assert page.inner_text('[data-testid="kvs-history-label"]') == f"step {k} of {last}"

    # Queues: that step's requests, in that step's queues.
    for name in ("waiting", "running", "finished"):
        column = page.locator(f'[data-testid="kvs-queue-{name}"]')
        reqs = entry.snapshot["queues"][name]
        assert column.get_attribute("data-count") == str(len(reqs))
        ids = column.locator(".kvs-card").evaluate_all("cs => cs.map(c => c.dataset.requestId)")
        want = [r["request_id"] for r in reqs]
        assert ids == (want[::-1] if name == "finished" else want)
    assert "preempted" in page.inner_text('[data-testid="kvs-queues"]')

    # Block pool: that step's counts and block tables.
    state = views.block_pool_state(entry.record, entry.snapshot)
    assert page.inner_text('[data-testid="kvs-leg-free"]') == f"free {state['counts']['free']}"
    assert page.inner_text('[data-testid="kvs-leg-ev-freed"]') == f"freed {state['counts']['freed']}"
    for table in state["block_tables"]:
        cells = page.locator(f'[data-testid="kvs-bt-{table["request_id"]}"] .kvs-bt-cell')
        assert cells.evaluate_all("cs => cs.map(c => Number(c.dataset.block))") == table["block_table"]

    # Slot mapping: that step's packed batch, one cell per row.
    batch = entry.record["batch"]
    sub = page.inner_text('[data-testid="kvs-slot-mapping"] .kvs-sub')
    assert f"query_start_loc [{', '.join(map(str, batch['query_start_loc']))}]" in sub
    for sch in entry.record["scheduled"]:
        assert page.locator(f'[data-testid="kvs-seg-{sch["request_id"]}"] .kvs-cell').count() == sch["num_tokens"]

    # Hover a block held at that step: the tooltip, then its tokens from the embedded data.
    block = next(b for b in entry.snapshot["block_pool"]["blocks"] if b["owners"] and b["token_ids"])
    tip, (x, y) = hover_block(page, page, block["block_id"])
    token_ids = json.dumps(block["token_ids"], separators=(",", ":"))
    page.wait_for_function("(ids) => document.querySelector('[data-testid=\"kvs-block-tooltip\"]').textContent"
                           ".includes('tokens ' + ids)", arg=token_ids, timeout=10_000)
    text = tip.inner_text()
    assert text.startswith(f"block {block['block_id']} \u00b7") and f"owner #{block['owners'][0]}" in text
    page.mouse.click(x, y)  # pin it: the detail box keeps it
    detail = page.locator('[data-testid="kvs-block-detail"]')
    detail.get_by_text(f"block {block['block_id']}", exact=True).wait_for(timeout=10_000)
    assert f"refcount {block['ref_count']}" in detail.inner_text()

    assert net.blocked == [] and net.seen == []  # zero network requests
    assert page.console_errors == []


# What each panel's model holds, read in the page: {panel: [trait, ...]} -> {panel: {trait: value}}
# (bytes traits as lists of their bytes).
READ_MODELS = """(want) => {
    const models = window.kvsExport.host.models;
    const plain = (v) => v instanceof DataView ? Array.from(new Uint8Array(v.buffer, v.byteOffset, v.byteLength)) : v;
    return Object.fromEntries(Object.entries(want).map(([name, keys]) =>
        [name, Object.fromEntries(keys.map((k) => [k, plain(models[name].get(k))]))]));
}"""


def _python_panels(s, i: int, texts) -> dict:
    """What explorer/ui/views.py gives each panel for history[i] (bytes as lists), JSON-shaped."""
    e = s.history[i]
    pool = views.block_pool_state(e.record, e.snapshot)
    pool.pop("blocks")
    pool = {k: list(v) if isinstance(v, bytes) else v for k, v in pool.items()}
    ledger = WhyLedger().feed(s.history)
    why = why_view.why_rows(ledger, e.step)
    rid = why_view.latest_admitted(ledger, e.step)   # the why panel as it stood after the shown step
    out = {"queues": views.queues_state(e.record, e.snapshot, why=why), "blocks": pool,
           "why": {"summary": why_view.summary_state(ledger, step=e.step),
                   "request": why_view.request_state(ledger, rid, e.snapshot, texts, e.step) if rid else {}},
           "slots": views.shown_slot_mapping(e.record, e.snapshot, texts),
           "controls": {"info": views.controls_info(e.record, e.snapshot),
                        "caption": history_captions(s.history)[i]},
           "attention": {"requests": views.probe_targets(e.snapshot), **views.attention_shape(e.snapshot)},
           "sampler": views.sampler_state(s.history[: i + 1], e.snapshot, "", texts),
           "latency": views.latency_state(e.snapshot)}
    return json.loads(json.dumps(out))


def show(page, index: int) -> None:
    scrub(page, index)
    page.wait_for_function("(k) => [...document.querySelectorAll('.kvs-panel')]"
                           ".every(p => p.dataset.step === String(k))", arg=index, timeout=READY_MS)


def test_the_panels_hold_explorer_views_states_at_scrubbed_steps(page, recorded) -> None:
    """The page computes no view: each panel's model holds what explorer/ui/views.py gives for the
    shown step, a selected request's sampler state too, and a hovered block's detail."""
    s, texts = recorded["session"], recorded["texts"]
    history = s.history
    open_export(page, recorded["path"])
    preempting = next(i for i, e in enumerate(history) if e.record and e.record["preempted"])
    for i in sorted({0, 1, preempting, len(history) // 2, len(history) - 1}):
        show(page, i)
        want = _python_panels(s, i, texts)
        got = page.evaluate(READ_MODELS, {name: list(state) for name, state in want.items()})
        for name in want:
            assert got[name] == want[name], (i, name)
        rows = views.latency_rows(history[i].snapshot)
        head = page.inner_text('[data-testid="kvs-latency"] .kvs-lat-head')
        assert head.startswith(f"{len(rows)} request{'' if len(rows) == 1 else 's'} \u00b7 "), head

    # Pick a request in the sampler that is not its default: its own sample, at this step and
    # (still picked) at the first step, before anything was sampled.
    k = next(i for i, e in enumerate(history) if e.record and len(e.record["sampled"]) >= 2)
    rid = list(history[k].record["sampled"])[-1]
    show(page, k)
    page.select_option('[data-testid="kvs-sampler-request"]', rid)
    for i in (k, 0):
        show(page, i)
        page.wait_for_function("(rid) => window.kvsExport.host.models.sampler.get('request_id') === rid", arg=rid)
        want = json.loads(json.dumps(views.sampler_state(history[: i + 1], history[i].snapshot, rid, texts)))
        got = page.evaluate(READ_MODELS, {"sampler": ["requests", "request_id", "sample"]})["sampler"]
        assert got == want, i

    # A block's hover detail: BlockPoolPanel.block_detail's, for the shown step.
    show(page, preempting)
    entry = history[preempting]
    blocks = entry.snapshot["block_pool"]["blocks"]
    held = next(b["block_id"] for b in blocks if b["owners"] and b["token_ids"])
    page.evaluate("(id) => window.kvsExport.host.models.blocks.send({action: 'block_detail', block_id: id})", held)
    page.wait_for_function("(id) => window.kvsExport.host.models.blocks.get('detail').block_id === id", arg=held)
    got = page.evaluate(READ_MODELS, {"blocks": ["detail"]})["blocks"]["detail"]
    assert got == json.loads(json.dumps(block_detail(blocks, held, entry.step, texts)))
    assert got["tokens"] and got["step"] == entry.step
    assert page.console_errors == []


def bar_at(page, fx: float) -> tuple[float, float, str]:
    """(x, y, step) of the timeline's token bar under `fx` (0..1) of the plot's width, mid-height."""
    return tuple(page.evaluate("""(fx) => {
        const svg = document.querySelector('[data-testid="kvs-timeline-chart"]');
        svg.scrollIntoView({block: "center"});
        const bars = [...svg.querySelectorAll('g.kvs-step-bar > rect:first-child')].map(r => r.getBoundingClientRect());
        const x = bars[0].left + fx * (bars[bars.length - 1].right - bars[0].left);
        const y = bars[0].top + bars[0].height / 2;
        const g = document.elementFromPoint(x, y).closest('g.kvs-step-bar');
        return [x, y, g ? g.dataset.step : null];
    }""", fx))


@pytest.mark.parametrize("viewport", [(1366, 768), (1920, 1080)], ids=lambda v: f"{v[0]}x{v[1]}")
def test_timeline_links_captions_and_engine_actions_are_off(page, recorded, viewport) -> None:
    s = recorded["session"]
    page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
    net = open_export(page, recorded["path"])
    # Engine actions: disabled, with the one line on how to run live.
    for tid in ("kvs-step-btn", "kvs-run-btn", "kvs-play-btn", "kvs-reset-btn"):
        assert page.is_disabled(f'[data-testid="{tid}"]'), tid
    assert not page.is_visible('[data-testid="kvs-add-form"]')
    assert not page.is_visible('[data-testid="kvs-drawer-toggle"]')
    assert not page.is_visible('[data-testid="kvs-pool-apply"]')
    assert "make lab" in page.inner_text('[data-testid="kvs-export-notice"]')
    # A recording has no "Live": its own last step instead.
    assert not page.is_visible('[data-testid="kvs-live-btn"]') and page.is_visible('[data-testid="kvs-export-last"]')
    assert "Live" not in page.inner_text('[data-testid="kvs-controls"]')
    # Scrubbed to a middle step, the timeline still draws the whole run, with a cursor on that step.
    steps = [int(e.step) for e in s.history if e.record]
    mid = steps[len(steps) // 2]
    scrub(page, mid)
    page.wait_for_selector(f'[data-testid="kvs-timeline-cursor"][data-step="{mid}"]', timeout=READY_MS)
    chart = page.locator('[data-testid="kvs-timeline-chart"]')
    first_last = (chart.get_attribute("data-first-step"), chart.get_attribute("data-last-step"))
    assert first_last == (str(steps[0]), str(steps[-1]))
    assert page.locator('[data-testid="kvs-timeline-chart"] g.kvs-step-bar').count() == len(steps)
    assert f"all {len(steps)} steps" in page.inner_text('[data-testid="kvs-timeline-sub"]')
    # A click anywhere on a bar lands on that bar's step (here at a fifth and at mid-width).
    for fx in (0.2, 0.5, 0.9):
        x, y, want = bar_at(page, fx)
        assert want is not None
        page.mouse.click(x, y)
        page.wait_for_function("(k) => [...document.querySelectorAll('.kvs-panel')].every(p => p.dataset.step === k)",
                               arg=want, timeout=READY_MS)
        assert page.get_attribute('[data-testid="kvs-timeline-cursor"]', "data-step") == want
        assert page.locator('[data-testid="kvs-timeline-chart"] g.kvs-step-bar').count() == len(steps)
    # A click on a timeline bar shows that step everywhere, its caption included.
    page.click('[data-testid="kvs-timeline"] g.kvs-step-bar[data-step="1"]')
    page.wait_for_function("() => [...document.querySelectorAll('.kvs-panel')].every(p => p.dataset.step === '1')",
                           timeout=READY_MS)
    assert page.inner_text('[data-testid="kvs-export-caption"]') == recorded["captions"][1]
    # The why panel says the run as it stood after the shown step, not the whole run's.
    ledger = WhyLedger().feed(s.history)
    summary = page.inner_text('[data-testid="kvs-why-summary-text"]')
    assert summary == ledger.summary(1).text() != ledger.summary().text()
    # Proving needs a kernel: the button is off and its tip says why (no live button that can only refuse).
    prove = page.locator('[data-testid="kvs-why-prove"]')
    assert prove.is_disabled() and prove.get_attribute("title").startswith("this page is a recording")
    # The Dashboard's order: the pool above the why panel, and at a laptop's 1366 x 768 above the fold.
    page.evaluate("() => window.scrollTo(0, 0)")
    pool_top = page.locator('[data-testid="kvs-block-pool"]').bounding_box()["y"]
    assert pool_top < page.locator('[data-testid="kvs-why-summary"]').bounding_box()["y"]
    assert pool_top < viewport[1]
    scrub(page, 0)
    page.wait_for_selector('[data-testid="kvs-queues"][data-step="0"]', timeout=READY_MS)
    assert page.inner_text('[data-testid="kvs-export-caption"]') == recorded["captions"][0]
    # Linked: choosing a request in the queues points the sampler at it.
    scrub(page, 3)
    page.wait_for_selector('[data-testid="kvs-queues"][data-step="3"]', timeout=READY_MS)
    rid = s.entry(3).snapshot["queues"]["running"][-1]["request_id"]
    page.click(f'[data-testid="kvs-req-{rid}"]')
    page.wait_for_function("(rid) => document.querySelector('[data-testid=\"kvs-sampler-request\"]').value === rid",
                           arg=rid, timeout=10_000)
    assert "kvs-selected" in page.get_attribute(f'[data-testid="kvs-req-{rid}"]', "class")
    # "last step" takes it back to the end; the TTFT/ITL charts follow the shown step.
    page.click('[data-testid="kvs-export-last"]')
    last = s.history[-1].step
    page.wait_for_selector(f'[data-testid="kvs-latency"][data-step="{last}"]', timeout=READY_MS)
    rows = views.latency_rows(s.current.snapshot)
    head = page.inner_text('[data-testid="kvs-latency"] .kvs-lat-head')
    with_first_token = sum(r["time_to_first_token"] is not None for r in rows)
    assert head.startswith(f"{len(rows)} requests \u00b7 {with_first_token} with a first token")
    assert page.locator('[data-testid="kvs-latency"] svg').count() == 4  # the notebook's four charts, by its own ESM
    itl_ticks = page.locator('[data-testid="kvs-lat-itl"] .kvs-lat-tick').count()
    assert itl_ticks == sum(bool(r["inter_token_latency"]) for r in rows)  # every request labelled
    assert net.blocked == [] and net.seen == [] and page.console_errors == []


def test_a_shortened_recording_says_so(page, recorded) -> None:
    open_export(page, recorded["short"])
    notice = page.inner_text('[data-testid="kvs-export-limit"]')
    last = recorded["session"].current.step
    assert "the last 5 steps" in notice and f"{last - 5}\u2013{last}" in notice
    assert page.get_attribute('[data-testid="kvs-history-slider"]', "max") == "5"
    assert page.console_errors == []
