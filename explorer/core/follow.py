"""Following a Session's source in a thread of its own: steps are applied as they become
ready (a live server's feed, or an engine run to idle), while the notebook's own thread stays
free. `Follower.start` / `stop` are what `Session.follow` and `Session.pause` call."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Follower:
    """Calls `poll()` every `interval` seconds in a daemon thread until stopped."""

    def __init__(self, poll: Callable[[], object], name: str = "kvscope-follow") -> None:
        self._poll = poll
        self._name = name
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, interval: float) -> bool:
        """Start following; False when it already runs."""
        if self.running:
            return False
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    self._poll()
                except Exception:  # following must outlive one bad step (logged, not raised)
                    log.exception("following the session's source failed")

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        return True

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop following (the step being applied finishes first); False when it was not running."""
        was = self.running
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)
        return was


def wait_until(ready: Callable[[], bool], timeout: float, interval: float) -> bool:
    """Call `ready()` every `interval` seconds until it returns True (-> True) or `timeout`
    seconds have passed (-> False); it is called once more at the deadline before giving up."""
    end = time.monotonic() + timeout
    while True:
        if ready():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)
