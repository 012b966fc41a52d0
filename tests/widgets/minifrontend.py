"""A minimal widget front end in a plain HTML page, for browser checks of the panels.

It runs each panel's real ESM and CSS in headless chromium against a tiny model shim
(get / set / on / off / send / save_changes), and wires it to the real Python widget:
a browser `model.send(...)` goes to `widget._handle_msg(...)` through a Playwright
binding, and the binding's answer carries the trait changes and custom messages
(acks) the Python side produced, in that order, as the Jupyter kernel would.
No JupyterLab is involved; the Lab end-to-end suite lives in tests/e2e.
"""
from __future__ import annotations

import base64
import json
from typing import Any

from ipywidgets.widgets.widget import _remove_buffers

_RUNTIME_JS = r"""
window.__kvs = { models: {}, errors: [] };
window.addEventListener("error", (e) => window.__kvs.errors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.__kvs.errors.push(String(e.reason)));
function decodeValue(v) {
  if (v && typeof v === "object" && v.__b64__ !== undefined) {
    const bin = atob(v.__b64__); const u = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    return new DataView(u.buffer);
  }
  return v;
}
function makeModel(name, state) {
  const values = {}; const handlers = {};
  for (const [k, v] of Object.entries(state)) values[k] = decodeValue(v);
  const emit = (ev, ...args) => (handlers[ev] || []).slice().forEach((h) => h(...args));
  const dirty = {};
  const model = {
    get: (k) => values[k],
    set: (k, v) => { values[k] = v; dirty[k] = v; emit(`change:${k}`); },
    on: (ev, h) => { (handlers[ev] = handlers[ev] || []).push(h); },
    off: (ev, h) => { if (!ev) { for (const k in handlers) delete handlers[k]; return; }
                      handlers[ev] = (handlers[ev] || []).filter((x) => h && x !== h); },
    save_changes: () => { const d = { ...dirty }; for (const k in dirty) delete dirty[k];
                          window.kvsToPython(name, { __state__: d }).then(apply); },
    send: (content) => { window.kvsToPython(name, content).then(later).then(apply); },
    _apply(updates) {
      for (const [k, v] of Object.entries(updates)) { values[k] = decodeValue(v); emit(`change:${k}`); }
    },
    _custom(msg) { emit("msg:custom", msg, []); },
  };
  return model;
}
// A kernel's answer takes a while to come back (JupyterLab: tens of ms); `latency_ms` holds it that long.
window.__kvsLatencyMs = 0;
function later(reply) {
  const ms = window.__kvsLatencyMs;
  return ms > 0 ? new Promise((resolve) => setTimeout(() => resolve(reply), ms)) : reply;
}
function apply(reply) {
  if (!reply) return;
  for (const [name, updates] of Object.entries(reply.updates || {})) window.__kvs.models[name]._apply(updates);
  for (const [name, msgs] of Object.entries(reply.customs || {})) {
    msgs.forEach((m) => window.__kvs.models[name]._custom(m));
  }
}
window.__kvsApply = apply;
window.__kvsMount = async (name, esm, css, state) => {
  const style = document.createElement("style"); style.textContent = css; document.head.append(style);
  const mod = await import(URL.createObjectURL(new Blob([esm], { type: "text/javascript" })));
  const model = makeModel(name, state);
  window.__kvs.models[name] = model;
  const el = document.createElement("div"); el.className = "kvs-host"; el.dataset.panel = name;
  document.getElementById("root").append(el);
  const widget = mod.default;
  const render = widget.render || (widget.default && widget.default.render);
  await render({ model, el });
};
"""

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>kvscope panels</title>
<style>body{margin:8px;font-family:sans-serif;width:BODY_WIDTH} .kvs-host{margin-bottom:10px}</style>
</head><body><div id="root"></div></body></html>"""


def _encode_state(widget: Any) -> dict:
    """The widget's synced state, bytes as {"__b64__": ...} so it survives JSON."""
    state = widget.get_state()
    state, buffer_paths, buffers = _remove_buffers(state)
    for path, buf in zip(buffer_paths, buffers):
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = {"__b64__": base64.b64encode(bytes(buf)).decode()}
    return state


class MiniFrontend:
    """Mounts Python panels in a Playwright page and keeps both sides in sync; `latency_ms`
    delays each answer to a browser action as a kernel's round trip would."""

    def __init__(self, page: Any, panels: dict[str, Any], *, body_width: str = "1100px",
                 latency_ms: int = 0) -> None:
        self.page = page
        self.panels = panels
        self._pushed: dict[str, str] = {}
        self._customs: dict[str, list] = {name: [] for name in panels}
        for name, widget in panels.items():
            # Capture what Python sends (acks) instead of writing to a kernel comm.
            widget.send = (lambda content, buffers=None, _n=name: self._customs[_n].append(content))
        page.expose_function("kvsToPython", self._from_browser)
        page.set_content(_PAGE.replace("BODY_WIDTH", body_width))
        page.add_script_tag(content=_RUNTIME_JS)
        page.evaluate("(ms) => { window.__kvsLatencyMs = ms; }", latency_ms)  # a kernel's round trip
        for name, widget in panels.items():
            state = _encode_state(widget)
            self._pushed[name] = {k: json.dumps(v, sort_keys=True) for k, v in state.items()}
            page.evaluate("([n, e, c, s]) => window.__kvsMount(n, e, c, s)",
                          [name, str(widget._esm), str(widget._css), state])

    def _changes(self) -> dict:
        """Trait changes since the last push, and the custom messages queued meanwhile."""
        updates: dict[str, dict] = {}
        for name, widget in self.panels.items():
            state = _encode_state(widget)
            last = self._pushed[name]
            diff = {}
            for k, v in state.items():
                s = json.dumps(v, sort_keys=True)
                if last.get(k) != s:
                    diff[k] = v
                    last[k] = s
            if diff:
                updates[name] = diff
        customs = {n: m for n, m in self._customs.items() if m}
        self._customs = {name: [] for name in self.panels}
        return {"updates": updates, "customs": customs}

    def _from_browser(self, name: str, content: dict) -> dict:
        widget = self.panels[name]
        if "__state__" in content:
            widget.set_state(content["__state__"])
        else:
            widget._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})
        return self._changes()

    def sync(self) -> None:
        """Push Python-side changes made outside a browser action (e.g. session.step())."""
        self.page.evaluate("(r) => window.__kvsApply(r)", self._changes())

    def errors(self) -> list[str]:
        return self.page.evaluate("() => window.__kvs.errors")
