"""vLLM's start-up output folded into one progress line.

vLLM prints a lot while it starts (its logger, Python warnings, NUMA and thread notes from
C++, a safetensors progress bar that a notebook draws as a widget): in a notebook that is a red
wall before the first panel.
`StartupLog` collects all of it (Python's sys.stdout / sys.stderr and the process's file
descriptors 1 and 2, and the progress bar as console text) into a file, and shows one line
instead: what vLLM is doing now (its latest line that is not a warning) and the seconds so far.
At the end the line says how it went, and the whole log is one click away
(a <details> in a notebook; its file path in a terminal).
"""
from __future__ import annotations

import contextvars
import html
import os
import re
import sys
import tempfile
import threading
import time
from typing import Any

from engine.progress import in_notebook

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TICK_S = 0.5          # how often the progress line is redrawn
LAST_LINE_CHARS = 140  # the progress line shows this much of vLLM's latest output


def last_line(text: str) -> str:
    """The latest non-empty line of console output (progress bars redraw with \\r)."""
    for line in reversed(re.split(r"[\r\n]+", _ANSI.sub("", text))):
        line = line.strip()
        if line:
            return line[:LAST_LINE_CHARS]
    return ""


# vLLM's logger: "INFO 12-03 15:40:01 [loader.py:12] text" (a worker's lines start with "(Name pid=N)").
_LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
                         r"\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s*")
# Lines that say something is off rather than what vLLM is doing: they stay in the log.
_WARNING = re.compile(r"^(?:\([^)]*\)\s*)?(?:WARNING|ERROR|CRITICAL)\b|\w*Warning: |^warnings\.warn\(")


def progress_line(text: str) -> str:
    """What vLLM is doing now, for the one line: the latest line of console output that is not a
    warning (a WARNING from vLLM's logger, a Python warning and its source line), without the
    logger's level, time and file."""
    for line in reversed(re.split(r"[\r\n]+", _ANSI.sub("", text))):
        line = line.strip()
        if not line or _WARNING.search(line):
            continue
        line = _LOG_PREFIX.sub("", line)
        if line:
            return line[:LAST_LINE_CHARS]
    return ""


def count_warnings(text: str) -> int:
    """How many lines of the log are vLLM's WARNINGs or Python warnings (said in the final line)."""
    return sum(1 for line in _ANSI.sub("", text).splitlines()
               if _WARNING.search(line.strip()) and not line.strip().startswith("warnings.warn("))


class StartupLog:
    """Context manager: everything written while vLLM starts goes to a log file; one line shows
    progress (`title`, elapsed seconds, the latest line). `done(text)` sets the final line's
    tail (e.g. a notice). `log_text` is the whole log afterwards; `path` its file."""

    def __init__(self, title: str, *, show: bool = True) -> None:
        self.title = title
        self.show = show
        self.note = ""
        self.log_text = ""
        self._file = tempfile.NamedTemporaryFile("w+", prefix="kvscope-vllm-start-", suffix=".log", delete=False,
                                                 encoding="utf-8", errors="replace")
        self.path = self._file.name
        self._stop = threading.Event()
        self._t0 = 0.0
        self._handle: Any = None
        self._saved_fds: list[int] = []
        self._streams: tuple[Any, Any] = (None, None)
        self._swapped: list[tuple[Any, Any]] = []
        self._bars: list[tuple[Any, type]] = []  # (module, its notebook progress bar) while vLLM starts
        self._notebook = in_notebook()

    # -- capture ---------------------------------------------------------------------------
    def __enter__(self) -> StartupLog:
        self._t0 = time.monotonic()
        if self.show and self._notebook:
            from IPython.display import HTML, display

            self._handle = display(HTML(self._html("starting\u2026", running=True)), display_id=True)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream is no reason to fail the start
                pass
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = self._file
        try:
            for fd in (1, 2):
                self._saved_fds.append(os.dup(fd))
                os.dup2(self._file.fileno(), fd)
        except OSError:  # no real descriptors (an embedded interpreter): Python-level capture only
            self._restore_fds()
        self._swap_logging_streams()
        self._console_progress_bars()
        # The kernel's idea of the running cell travels with the context: the line updates in it.
        self._ticker = threading.Thread(target=contextvars.copy_context().run, args=(self._tick,),
                                        name="kvscope-vllm-start", daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop.set()
        self._ticker.join(timeout=2)
        self._file.flush()
        self._restore_fds()
        sys.stdout, sys.stderr = self._streams
        self._restore_logging_streams()
        for module, bar in self._bars:
            module.tqdm = bar
        with open(self.path, encoding="utf-8", errors="replace") as f:
            self.log_text = f.read()
        self._file.close()
        seconds = time.monotonic() - self._t0
        ok = exc_type is None
        summary = (f"started in {seconds:.0f} s" if ok else f"did not start ({seconds:.0f} s)")
        if self.note:
            summary += f" \u00b7 {self.note}"
        warned = count_warnings(self.log_text)
        if warned:
            summary += f" \u00b7 {warned} warning{'s' if warned != 1 else ''} in the log"
        self._final(summary, ok)

    def _console_progress_bars(self) -> None:
        """vLLM draws its weight-loading bar ("Loading safetensors checkpoint shards") with
        tqdm.auto, which in a notebook is an ipywidgets bar displayed straight into the cell,
        past any capture. While vLLM starts, tqdm.auto's bar is the console one, written to the
        log like the rest of the output; vLLM modules that bound the notebook bar at an earlier
        import get the console one too. Both are put back at the end."""
        try:
            import tqdm.auto
            import tqdm.std
        except ImportError:  # no tqdm: no bar to fold
            return
        modules = [tqdm.auto, *(m for n, m in list(sys.modules.items()) if n.startswith("vllm.") and m is not None)]
        for module in modules:
            bar = getattr(module, "tqdm", None)
            # In a kernel tqdm.auto's class mixes tqdm.notebook's widget bar into the asyncio one.
            if isinstance(bar, type) and any(c.__module__ == "tqdm.notebook" for c in bar.__mro__):
                self._bars.append((module, bar))
                module.tqdm = tqdm.std.tqdm

    def _restore_fds(self) -> None:
        for fd, saved in zip((1, 2), self._saved_fds):
            os.dup2(saved, fd)
            os.close(saved)
        self._saved_fds = []

    def _swap_logging_streams(self) -> None:
        """vLLM's logger writes to the stream it captured at import: point it here meanwhile."""
        import logging

        for name in ("vllm", ""):
            for handler in logging.getLogger(name or None).handlers:
                stream = getattr(handler, "stream", None)
                if stream in self._streams and isinstance(handler, logging.StreamHandler):
                    self._swapped.append((handler, stream))
                    handler.setStream(self._file)

    def _restore_logging_streams(self) -> None:
        import logging

        for handler, stream in self._swapped:
            handler.setStream(stream)
        # A logger configured while captured (vLLM imported inside) took our file: give it the real stream.
        for logger in [logging.getLogger("vllm"), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
                                                   if n.startswith("vllm"))]:
            for handler in getattr(logger, "handlers", []):
                if getattr(handler, "stream", None) is self._file:
                    handler.setStream(self._streams[0])

    # -- the one line ----------------------------------------------------------------------
    def _latest(self) -> str:
        try:
            self._file.flush()
            with open(self.path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.path) - 4096))
                return progress_line(f.read().decode("utf-8", "replace"))
        except OSError:
            return ""

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            seconds = time.monotonic() - self._t0
            self._progress(f"{seconds:.0f} s \u00b7 {self._latest() or 'starting'}")

    def _progress(self, text: str) -> None:
        if not self.show:
            return
        if self._handle is not None:
            from IPython.display import HTML

            self._handle.update(HTML(self._html(text, running=True)))
        elif self._streams[1] is not None:
            self._streams[1].write(f"\r{self.title}: {text}"[:200].ljust(120))
            self._streams[1].flush()

    def _final(self, summary: str, ok: bool) -> None:
        if not self.show:
            return
        if self._handle is not None:
            from IPython.display import HTML

            self._handle.update(HTML(self._html(summary, running=False, ok=ok)))
        elif self._streams[1] is not None:
            self._streams[1].write(f"\r{self.title} {summary} (start-up log: {self.path})".ljust(120) + "\n")
            self._streams[1].flush()

    def _html(self, text: str, *, running: bool, ok: bool = True) -> str:
        color = "#555" if running else ("#2e7d32" if ok else "#c62828")
        lines = self.log_text.count("\n") if not running else 0
        log = ("" if running else
               f'<details data-testid="kvs-vllm-start-log"><summary style="cursor:pointer;color:#555">'
               f'vLLM\'s start-up log ({lines} lines)</summary><pre style="max-height:320px;overflow:auto;'
               f'font-size:11px">{html.escape(_ANSI.sub("", self.log_text))}</pre></details>')
        return (f'<div class="kvs-vllm-start" data-testid="kvs-vllm-start" data-running="{str(running).lower()}" '
                f'style="font-family:sans-serif;font-size:12px;color:{color}"><b>{html.escape(self.title)}</b> '
                f'{html.escape(text)}</div>{log}')


def first_vllm_import(title: str) -> StartupLog:
    """Fold what vLLM prints while it is first imported into one line titled `title` (its log
    one click away), as a vLLM start does; after the first import, a capture that shows nothing."""
    return StartupLog(title, show="vllm" not in sys.modules)
