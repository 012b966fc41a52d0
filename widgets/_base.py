"""The base class every kvscope panel shares: a displayed step, and browser actions."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import anywidget
import traitlets as t

_HERE = Path(__file__).parent
_log = logging.getLogger(__name__)

ActionHandler = Callable[[dict], None]


def bundle_esm(name: str) -> str:
    """`_schema.js` + `_common.js` + `<name>`: panels share the record schema, colour and
    byte helpers without a bundler.

    anywidget loads each panel's ESM as one module, so a shared import would need a
    URL; prepending the helpers keeps every file plain and loads nothing at run time.
    """
    return "\n".join((_HERE / f).read_text() for f in ("_schema.js", "_common.js", name))


def bundle_css(name: str) -> str:
    """`_common.css` + `<name>`: one look across panels."""
    return (_HERE / "_common.css").read_text() + "\n" + (_HERE / name).read_text()


class Panel(anywidget.AnyWidget):
    """A kvscope panel: plain-data traitlets in, `{"action": ...}` messages out.

    `step` is the engine step the panel shows (its root carries `data-step`);
    `live` is False while the user scrubs history. Browser actions reach
    `on_action` callbacks (the Dashboard routes them to the Session); every action
    that carries a `seq` is acknowledged once handled, so the browser can count
    pending clicks and pace Play on real results.

    `frozen` marks a still (its binder stopped following the Session): the browser
    swallows clicks on it and shows "frozen at step N", and Python ignores every action
    but hover look-ups (`FROZEN_ACTIONS`). `link_group` names the linked-highlighting
    channel the panels of one Dashboard share in the browser (_common.js, kvsLink).
    """

    #: Actions a frozen panel still answers: they change nothing a still shows.
    FROZEN_ACTIONS = frozenset({"block_detail"})

    step = t.Int(0).tag(sync=True)
    live = t.Bool(True).tag(sync=True)
    frozen = t.Bool(False).tag(sync=True)
    link_group = t.Unicode("").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._action_handlers: list[ActionHandler] = []
        # Not named _handle_custom_msg: that name replaces ipywidgets' own dispatcher.
        self.on_msg(self._on_browser_msg)

    def on_action(self, handler: ActionHandler) -> Callable[[], None]:
        """Call `handler(content)` for each browser action; returns an unsubscribe."""
        self._action_handlers.append(handler)
        return lambda: self._action_handlers.remove(handler)

    def show(self, state: dict) -> None:
        """Set several traits at once (one comm message): a view state from explorer.ui.views."""
        with self.hold_sync():
            for key, value in state.items():
                setattr(self, key, value)

    def handle_action(self, content: dict) -> bool:
        """Panel-local actions (no Session needed). True when fully handled here."""
        return False

    def dispatch(self, content: dict) -> str | None:
        """Run one action as if it came from the browser; returns an error text or None."""
        error = None
        if self.frozen and content.get("action") not in self.FROZEN_ACTIONS:
            return None  # a still: nothing it shows may change
        try:
            if not self.handle_action(content):
                for handler in list(self._action_handlers):
                    handler(content)
        except Exception as exc:  # a view must never take the kernel's comm down
            _log.exception("kvscope panel action %r failed", content.get("action"))
            error = f"{type(exc).__name__}: {exc}"
        return error

    def _on_browser_msg(self, _widget: object, content: Any, _buffers: list) -> None:
        if not isinstance(content, dict) or "action" not in content:
            return
        error = self.dispatch(content)
        if "seq" in content:
            self.send({"type": "ack", "seq": content["seq"], "error": error})
