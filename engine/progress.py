"""The progress line of the engine's long waits (loading weights, converting the default model),
in a terminal and in a notebook.

In a terminal it is tqdm's console bar. In a notebook it is one HTML line updated in place,
never a widget: tqdm's notebook bar is an ipywidget, and one that closes itself (leave=False)
leaves the saved notebook an output whose model no longer exists, which JupyterLab shows as
"Error displaying widget: model not found" when the notebook is opened again.
"""
from __future__ import annotations

import html
import sys
import time
from typing import Any

REDRAW_S = 0.2   # the notebook line is redrawn at most this often


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython with a kernel attached)."""
    shell = sys.modules.get("IPython")
    ip = shell.get_ipython() if shell is not None else None
    return ip is not None and getattr(ip, "kernel", None) is not None


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class NotebookLine:
    """One line of text in a notebook cell's output, redrawn in place (an HTML output, never a
    widget); `show("")` empties it."""

    def __init__(self) -> None:
        from IPython.display import HTML, display

        self._html = HTML
        self._handle = display(HTML(""), display_id=True)

    def show(self, text: str) -> None:
        if self._handle is not None:
            self._handle.update(self._html(
                f'<div class="kvs-progress" style="font-family:sans-serif;font-size:12px;color:#555">'
                f'{html.escape(text)}</div>' if text else ""))


class _NotebookBar:
    """`desc: done/total units` on a NotebookLine; emptied at close unless `leave`."""

    def __init__(self, total: int, desc: str, unit: str, leave: bool) -> None:
        self.total, self.desc, self.unit, self.leave = total, desc, unit, leave
        self.done, self._drawn = 0, 0.0
        self.line = NotebookLine()
        self.line.show(self._text())

    def _text(self) -> str:
        return f"{self.desc}: {self.done}/{self.total} {self.unit}s"

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._drawn >= REDRAW_S or self.done >= self.total:
            self._drawn = now
            self.line.show(self._text())

    def close(self) -> None:
        self.line.show(self._text() if self.leave else "")


def progress(total: int, desc: str, unit: str, *, disable: bool = False, leave: bool = False) -> Any:
    """A bar with update(n) and close(): tqdm's console bar, an HTML line in a notebook, or
    nothing (`disable`)."""
    if disable:
        return _Silent()
    if in_notebook():
        return _NotebookBar(total, desc, unit, leave)
    from tqdm.std import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=leave)
