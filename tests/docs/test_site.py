"""The documentation site (`make docs`, scripts/build_docs.py), built in strict mode and opened
in Debian chromium from file:// with every request recorded.

For each walkthrough chapter page built: it loads with no console error and no request
outside the site; its embedded replay scrubs to its last step, and the queues panel then
shows that step's queues (as the engine's snapshot had them when the site was built);
hovering a block shows its tooltip. A chapter's re-run at other settings runs in the page
(Pyodide, loaded on the first Run only), and every built chapter's re-run gives the same steps
in Pyodide under Node as in CPython, at the recorded settings and at three others. The API
reference lists LLM.generate, Session.step and explorer.export_html with their docstrings. A
broken link fails the strict build.

The build holds every chapter (KVSCOPE_DOCS_TEST_CHAPTERS: "all", the default, or a subset such
as "2,3"), without the vLLM pages' recordings, so every chapter's re-run is held to CPython under
Pyodide; the browser opens a few of its pages (KVSCOPE_DOCS_TEST_PAGES, default "2,3,13": one that
runs no step of its own, one that prefills, one whose engine is reset mid-chapter).
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.e2e.block_pool import hover_block

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build_docs.py"
CHAPTERS = os.environ.get("KVSCOPE_DOCS_TEST_CHAPTERS", "all")
READY_MS = 60_000


# A site built already (e.g. KVSCOPE_DOCS_TEST_SITE=docs/site after `make docs`, whose stage is
# build/docs_src): the tests then check it, every chapter it holds, instead of building one.
PREBUILT = os.environ.get("KVSCOPE_DOCS_TEST_SITE")


def _wanted() -> list[int]:
    if PREBUILT:
        manifest = Path(PREBUILT) / "walkthrough" / "replays" / "manifest.json"
        return sorted(int(n) for n in json.loads(manifest.read_text())) if manifest.exists() else []
    if CHAPTERS.strip() == "all":
        import nbformat
        spec = importlib.util.spec_from_file_location("build_docs", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _, chapters, _ = mod.split_chapters(nbformat.read(mod.NOTEBOOK, as_version=4))
        return [ch["number"] for ch in chapters]
    return sorted(int(x) for x in CHAPTERS.split(","))


WANTED = _wanted()
PAGES = [n for n in (int(x) for x in os.environ.get("KVSCOPE_DOCS_TEST_PAGES", "2,3,13").split(",")) if n in WANTED]


def _build_docs_module():
    spec = importlib.util.spec_from_file_location("build_docs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("nbclient")
    if PREBUILT:
        site = Path(PREBUILT).resolve()
        stage = Path(os.environ.get("KVSCOPE_DOCS_TEST_STAGE", REPO / "build" / "docs_src")).resolve()
        root = tmp_path_factory.mktemp("docs")
        (root / "site").symlink_to(site)
        (root / "stage").symlink_to(stage)
        return _site_info(root)
    root = tmp_path_factory.mktemp("docs")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--chapters", ",".join(map(str, WANTED)),
                           "--site-dir", str(root / "site"), "--stage-dir", str(root / "stage")],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    print(f"\nsite built in {time.monotonic() - t0:.1f} s\n{proc.stdout[-1500:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return _site_info(root)


def _site_info(root: Path) -> dict:
    site = root / "site"
    manifest = json.loads((site / "walkthrough" / "replays" / "manifest.json").read_text())
    pages = {int(n): site / "walkthrough" / f for n, f in
             ((p.name.split("-")[0], p.name) for p in (site / "walkthrough").glob("[0-9][0-9]-*.html"))}
    return {"root": root, "site": site, "manifest": manifest, "pages": pages}


class Recorder:
    """Every request the page makes; anything that is not a file of the site is aborted."""

    def __init__(self, page, site: Path) -> None:
        self.prefix = site.resolve().as_uri() + "/"
        self.outside: list[str] = []
        self.requests: list[str] = []
        page.context.route("**/*", self._route)

    def _inside(self, url: str) -> bool:
        # blob: URLs are made by the page itself (the replay's panels load their modules so).
        return url.startswith(self.prefix) or url.startswith(("blob:", "data:", "about:"))

    def _route(self, route) -> None:
        self.requests.append(route.request.url)
        if self._inside(route.request.url):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    pg = context.new_page()
    pg.console_errors = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: pg.console_errors.append(f"{m.location.get('url', '')}: {m.text}")
          if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.console_errors.append(str(e)))
    yield pg
    context.close()


def test_the_build_holds_the_chapters_asked_for_within_budget(site) -> None:
    assert sorted(site["pages"]) == WANTED
    assert sorted(map(int, site["manifest"])) == WANTED
    for files in site["manifest"].values():
        for f in files:
            replay = site["site"] / "walkthrough" / "replays" / f["file"]
            assert replay.stat().st_size == f["bytes"] <= 1_000_000
            assert f["notice"] == ""  # the whole chapter is in the replay
    vllm = site["site"] / "vllm-replays" / "manifest.json"
    for f in json.loads(vllm.read_text())["replays"] if vllm.exists() else []:
        assert (site["site"] / "vllm-replays" / f["file"]).stat().st_size <= 1_000_000
    total = sum(p.stat().st_size for p in site["site"].rglob("*") if p.is_file())
    assert total <= 30_000_000
    # Nothing in the pages points at a host: fonts, scripts and styles all lie in the site.
    for html_file in site["site"].rglob("*.html"):
        text = html_file.read_text(encoding="utf-8")
        for attr in ('src="http', "src='http", 'href="//', "url(http", "@import url(", "fonts.googleapis"):
            assert attr not in text, (html_file.name, attr)
        for line in text.splitlines():
            if "<link" in line and 'href="http' in line and 'rel="stylesheet"' in line:
                pytest.fail(f"{html_file.name}: external stylesheet {line.strip()[:200]}")


def check_replay(page, holder, f: dict) -> None:
    """The replay in iframe `holder` scrubs to its last step, its queues panel shows that step's
    queues as `f` (the build's manifest, from the engine's snapshot) lists them, and a hovered
    block shows its tooltip."""
    holder.scroll_into_view_if_needed()
    frame = holder.element_handle().content_frame()
    frame.wait_for_selector("body[data-ready=true]", timeout=READY_MS)
    assert frame.is_hidden("#kvs-export-error")
    slider = frame.locator('[data-testid="kvs-history-slider"]')
    last_index = int(slider.get_attribute("max"))
    assert last_index == f["steps_included"] - 1
    slider.evaluate("(el, i) => { el.value = String(i); el.dispatchEvent(new Event('input')); }", last_index)
    last = f["last_step"]
    frame.wait_for_function("(k) => [...document.querySelectorAll('.kvs-panel')]"
                            ".every(p => p.dataset.step === String(k))", arg=last, timeout=READY_MS)
    assert frame.inner_text('[data-testid="kvs-history-label"]') == f"step {last} of {last}"
    # The queues panel shows that step: its data-step and the requests in each queue.
    assert frame.get_attribute('[data-testid="kvs-queues"]', "data-step") == str(last)
    for name, want in f["queues"].items():
        column = frame.locator(f'[data-testid="kvs-queue-{name}"]')
        assert column.get_attribute("data-count") == str(len(want))
        ids = column.locator(".kvs-card").evaluate_all("cs => cs.map(c => c.dataset.requestId)")
        assert sorted(ids) == sorted(want), name

    # Hover a block (one held by a request at that step, when there is one): its tooltip.
    block = f["hover_block"]
    assert f["num_blocks"] <= 256  # hover_block draws on 26 px cells
    tip, _ = hover_block(page, frame, block["block_id"])
    text = tip.inner_text()
    assert text.startswith(f"block {block['block_id']} \u00b7"), text
    for owner in block["owners"]:
        assert f"#{owner}" in text, text
    page.mouse.move(1, 1)


@pytest.mark.parametrize("number", PAGES)
def test_chapter_page_loads_offline_and_its_replay_scrubs_and_hovers(page, site, number: int) -> None:
    net = Recorder(page, site["site"])
    page.goto(site["pages"][number].resolve().as_uri())
    frames = page.locator("iframe[data-testid=kvs-replay]")
    files = site["manifest"][str(number)]
    assert frames.count() == len(files) >= 1
    for i, f in enumerate(files):
        check_replay(page, frames.nth(i), f)
    assert page.locator(".kvs-check-passed").count() >= 1  # the chapter's checks ran at build time
    assert net.outside == []
    assert page.console_errors == []


@pytest.mark.parametrize("number", PAGES)
def test_a_chapter_page_links_to_its_replay_from_the_first_screen(browser, site, number: int) -> None:
    # The replay sits thousands of px down a chapter's page: a link on the first screen of a
    # laptop (1366x768) goes to it.
    pg = browser.new_page(viewport={"width": 1366, "height": 768})
    try:
        pg.goto(site["pages"][number].resolve().as_uri())
        jump = pg.locator("[data-testid=kvs-jump-replay]")
        box = jump.bounding_box()
        assert box is not None and box["y"] + box["height"] <= 768, box
        jump.click()
        pg.wait_for_function("() => { const r = document.getElementById('replay').getBoundingClientRect();"
                             " return r.top >= -2 && r.top < 200; }")
    finally:
        pg.close()


def test_vllm_page_shows_both_engines_or_says_why_not(page, site) -> None:
    net = Recorder(page, site["site"])
    page.goto((site["site"] / "vllm.html").resolve().as_uri())
    manifest = site["site"] / "vllm-replays" / "manifest.json"
    if not manifest.exists():  # subset builds record no vLLM run: the page must say so
        assert "holds no recorded vLLM replay" in page.inner_text("article")
    else:
        data = json.loads(manifest.read_text())
        assert data["differing_steps"] == []
        frames = page.locator("iframe[data-testid=kvs-replay]")
        assert frames.count() == len(data["replays"]) == 2
        for i, f in enumerate(data["replays"]):
            check_replay(page, frames.nth(i), f)
    assert net.outside == []
    assert page.console_errors == []


def test_whatif_page_shows_its_replay_and_sweep_or_says_why_not(page, site) -> None:
    net = Recorder(page, site["site"])
    page.goto((site["site"] / "whatif.html").resolve().as_uri())
    manifest = site["site"] / "whatif-replays" / "manifest.json"
    if not manifest.exists():  # subset builds record no what-if example: the page must say so
        assert "holds no recorded what-if example" in page.inner_text("article")
    else:
        data = json.loads(manifest.read_text())
        assert "0 differences" in data["identity"]
        frame = page.frame_locator("iframe[data-testid=kvs-whatif-replay]")
        frame.locator('[data-testid="kvs-whatif-slider"]').wait_for()
        if data["parting"]:
            assert data["parting"]["text"] in frame.locator('[data-testid="kvs-whatif-parting"]').inner_text()
            frame.locator('[data-testid="kvs-whatif-next"]').click()
            assert frame.locator('[data-testid="kvs-whatif"]').get_attribute("data-index") == str(
                data["parting"]["index"] + 1)
        assert page.locator("[data-testid=kvs-whatif-sweep-chart] svg polyline").count() >= 1
    assert net.outside == []
    assert page.console_errors == []


def test_api_reference_lists_generate_step_and_export_html_with_their_docstrings(page, site) -> None:
    from engine import LLM
    from explorer.core.session import Session
    from explorer.export.page import export_html

    net = Recorder(page, site["site"])
    page.goto((site["site"] / "api.html").resolve().as_uri())
    for anchor, method in (("engine.LLM.generate", LLM.generate), ("explorer.core.session.Session.step", Session.step),
                           ("explorer.export.page.export_html", export_html)):
        heading = page.locator(f'[id="{anchor}"]')
        assert heading.count() == 1, anchor
        assert method.__name__ in heading.inner_text()
        # mkdocstrings: the heading, the signature and the docstring in one doc-object block.
        body = heading.evaluate("h => (h.closest('.doc-object') || h.parentElement).querySelector('.doc-contents')"
                                "?.innerText || ''")
        doc = " ".join(inspect.getdoc(method).replace("`", "").split())  # markdown: `x` shows as code
        assert " ".join(doc.split()[:8]) in " ".join(body.split()), (anchor, body[:300])
    assert net.outside == []
    assert page.console_errors == []


def test_search_works_from_file_and_pages_link_within_the_site(page, site) -> None:
    net = Recorder(page, site["site"])
    page.goto((site["site"] / "index.html").resolve().as_uri())
    page.click("input.md-search__input")  # the header's search field (a wide window shows it)
    page.keyboard.type("preemption", delay=30)  # Material searches on key events
    page.locator(".md-search-result__item").first.wait_for(timeout=20_000)
    assert "matching document" in page.inner_text(".md-search-result__meta")
    # Every link of the home page resolves to a file in the site.
    for href in page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)"):
        if href.startswith("file:"):
            path = Path(href.split("#")[0].removeprefix("file://"))
            assert path.exists(), href
    assert net.outside == []
    assert page.console_errors == []


def test_the_site_serves_from_a_plain_static_host(page, site) -> None:
    handler = partial(SimpleHTTPRequestHandler, directory=str(site["site"]))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        outside: list[str] = []
        page.on("request", lambda r: None if r.url.startswith((base, "blob:", "data:")) else outside.append(r.url))
        number = WANTED[-1]
        page.goto(base + f"walkthrough/{site['pages'][number].name}")
        frame = page.locator("iframe[data-testid=kvs-replay]").first.element_handle().content_frame()
        frame.wait_for_selector("body[data-ready=true]", timeout=READY_MS)
        assert outside == []
        assert page.console_errors == []
    finally:
        server.shutdown()


def test_strict_mode_fails_on_a_broken_link(site, tmp_path: Path) -> None:
    build_docs = _build_docs_module()
    stage = tmp_path / "stage"
    shutil.copytree(site["root"] / "stage", stage)
    (stage / "index.md").write_text((stage / "index.md").read_text() + "\n[gone](no-such-page.md)\n")
    nav = json.loads((stage / "nav.json").read_text())
    with pytest.raises(BaseException) as failed:
        build_docs.run_mkdocs(nav, strict=True, stage=stage, site=tmp_path / "site")
    assert "strict" in str(failed.value).lower() or "warning" in str(failed.value).lower()
    # ... and the same stage without the broken link builds.
    (stage / "index.md").write_text((stage / "index.md").read_text().replace("[gone](no-such-page.md)", ""))
    build_docs.run_mkdocs(nav, strict=True, stage=stage, site=tmp_path / "site2")
    assert (tmp_path / "site2" / "index.html").exists()


# -- a chapter re-run at other settings, in the reader's browser ----------------------------------
def _rerun_chapters(site: dict) -> list[int]:
    return [int(n) for n, files in site["manifest"].items() if any(f.get("workload") for f in files)]


def test_a_chapter_reruns_in_the_page_at_other_settings(page, site) -> None:
    number = max(_rerun_chapters(site))
    net = Recorder(page, site["site"])
    page.goto(site["pages"][number].resolve().as_uri())
    runtime = site["site"] / "walkthrough" / "rerun"
    requested = lambda: [u for u in net.requests if "/walkthrough/rerun/" in u or ".workload.js" in u]  # noqa: E731
    assert sorted(u.rsplit("/", 1)[1] for u in requested()) == ["rerun.css", "rerun.js"]  # nothing more yet
    form = page.locator("[data-testid=kvs-rerun]").first
    status = form.locator("[data-testid=kvs-rerun-status]")
    recorded = {k: form.locator(f"input[name={k}]").input_value() for k in ("num_blocks", "max_num_batched_tokens")}

    form.locator("input[name=num_blocks]").fill("1")   # refused, naming the setting; the page goes on
    t0 = time.monotonic()
    form.locator("[data-testid=kvs-rerun-run]").click()
    page.wait_for_function("(el) => el.textContent.startsWith('Not run')", arg=status.element_handle(),
                           timeout=60_000)
    first_run_s = time.monotonic() - t0
    assert status.inner_text() == "Not run: num_blocks must be an integer >= 2, got 1"

    form.locator("input[name=num_blocks]").fill(recorded["num_blocks"])
    form.locator("input[name=max_num_batched_tokens]").fill("4")   # every prompt in chunks of 4 tokens
    form.locator("[data-testid=kvs-rerun-run]").click()
    page.wait_for_function("(el) => el.textContent.startsWith('Done')", arg=status.element_handle(), timeout=60_000)
    result = form.locator("[data-testid=kvs-rerun-result]")
    assert result.locator(".kvs-rerun-label").inner_text().startswith("Re-run with budget=4: ")
    parting = result.locator("[data-testid=kvs-rerun-parting]").inner_text()
    assert "with budget=4" in parting and "the token budget of 4" in parting, parting
    rows = result.locator("[data-testid=kvs-rerun-table] tr").evaluate_all(
        "rs => rs.map(r => [...r.children].map(c => c.textContent))")
    assert rows[0] == ["", "recorded", "re-run"] and int(rows[1][2]) > int(rows[1][1])  # more steps in chunks of 4
    frame = result.locator("[data-testid=kvs-rerun-replay]").element_handle().content_frame()
    frame.wait_for_selector("body[data-ready=true]", timeout=READY_MS)
    assert "re-run with budget=4" in frame.inner_text("[data-testid=kvs-export-head]")
    assert frame.is_hidden("#kvs-export-error")
    assert frame.locator("[data-testid=kvs-queues]").count() == 1

    loaded = sum((runtime / u.rsplit("/", 1)[1]).stat().st_size for u in requested() if "/rerun/" in u)
    print(f"\nfirst Run: {first_run_s:.1f} s to a result, {loaded / 1e6:.1f} MB of the site loaded for it")
    assert loaded <= 20_000_000
    assert net.outside == []
    assert page.console_errors == []


def test_every_built_chapters_rerun_is_the_same_in_pyodide_as_in_cpython(site, tmp_path: Path) -> None:
    import base64

    from tests.docs.pyodide import run_in_pyodide
    from tests.whatif.rerun_compare import compare_runs

    replays = site["site"] / "walkthrough" / "replays"
    workloads = []
    for files in site["manifest"].values():
        for f in files:
            if f.get("workload"):
                text = (replays / f["workload"]).read_text()
                workloads.append(json.loads(text[text.index("] = ") + 4:].rstrip().rstrip(";")))
    assert workloads and all(f.get("rerun_differs") is None for fs in site["manifest"].values() for f in fs)
    settings = [{}, {"max_num_batched_tokens": 4}, {"num_blocks": 8, "enable_prefix_caching": False},
                {"block_size": 32, "max_num_seqs": 1}]
    payload = json.dumps({"workloads": workloads, "settings": settings})
    # The Python files as the site ships them (rerun/kvscope.zip.js), run by Pyodide's npm package.
    shipped = (site["site"] / "walkthrough" / "rerun" / "kvscope.zip.js").read_text()
    zip_bytes = base64.b64decode(shipped.split('b64: "', 1)[1].split('"', 1)[0])
    script = (REPO / "tests" / "whatif" / "rerun_compare.py").read_text() + "\ncompare_runs(INPUT)\n"
    assert run_in_pyodide(script, payload, tmp_path, zip_bytes) == compare_runs(payload)
