"""How a differential harness ends: each failure on stderr, then its headline and its counts as
the last line (JSON, which the tests read), and the exit status (1 on any difference)."""
from __future__ import annotations

import json
import sys
from typing import Any


def print_outcome(total: Any, headline: str) -> int:
    """`total`: the harness's counts (`failures`, `differences`, `summary()`)."""
    for failure in total.failures:
        print(failure, file=sys.stderr)
    print(headline)
    print(json.dumps(total.summary()))
    return 1 if total.differences else 0
