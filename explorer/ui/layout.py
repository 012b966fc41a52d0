"""The Dashboard's layout and selection links as data, read by the Dashboard, the one-file export's
page and its host script alike (no widget here, so the export's view code also runs where only
Python does: a docs page's Pyodide)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Row(NamedTuple):
    """One row of the Dashboard: its panels, side by side, each with its CSS `flex` ("": alone in
    the row, the row's whole width)."""
    panels: tuple[tuple[str, str], ...]
    wrap: bool = False   # narrow: the panels wrap under each other (else one height, stretched)

    @property
    def alone(self) -> bool:
        """One panel, the row's whole width."""
        return not self.panels[0][1]


#: The Dashboard's rows, top to bottom. The queues, the pool and this step's slots stay above a
#: laptop's fold (1366 x 768; the pool and the slots wrap under each other below ~2 x 440 px); the
#: chosen request's why and the prefix tree sit under the pool they are tied to. A row names a panel
#: that may be missing (an ON_DEMAND one, or one a caller left out): it is skipped there.
LAYOUT: tuple[Row, ...] = (
    Row((("controls", ""),)),
    Row((("queues", "3 1 0"), ("sampler", "1 1 0"))),
    Row((("blocks", "1 1 440px"), ("slots", "1 1 440px")), wrap=True),
    Row((("why", ""),)),
    Row((("tree", ""),)),
    Row((("attention", ""),)),
    Row((("tensor_parallel", ""),)),
    Row((("timeline", ""),)),
    Row((("latency", ""),)),
)
ON_DEMAND = ("tensor_parallel",)  # shown only where there is something to see (sharding)
POOL_KEYS = ("num_kv_blocks", "block_size")   # the controls' pool fields (a new engine)

#: A request chosen in one panel (its "select" action; source -> the panels that then show it).
#: A panel given a request shows it, pinned, until another choice (else it follows the step).
SELECTION_LINKS: dict[str, tuple[str, ...]] = {
    "queues": ("why", "sampler", "attention"),
    "why": ("why",),
    "sampler": ("sampler",),
    "attention": ("attention",),
}
#: Panels a cleared choice (the queues' selection undone) leaves on the request they show: the
#: attention heatmap costs a probe to draw, and an empty one says nothing.
KEEPS_CHOICE: tuple[str, ...] = ("attention",)


def chosen(target: str, rid: str, shown: str) -> str:
    """The request panel `target`, showing `shown`, shows once `rid` is chosen in a panel linked to
    it ("": the choice cleared). The export's host script applies the same rule to the same data."""
    return shown if not rid and target in KEEPS_CHOICE else rid


def laid_out() -> tuple[str, ...]:
    """Every panel LAYOUT places, in its order."""
    return tuple(name for row in LAYOUT for name, _ in row.panels)


def rows_of(panels: Iterable[str]) -> list[Row]:
    """LAYOUT's rows of `panels` (the others left out, an emptied row dropped), then one row per
    panel LAYOUT does not place (a new one: at the bottom, in the given order)."""
    shown = list(panels)
    rows = [Row(tuple((n, flex) for n, flex in row.panels if n in shown), row.wrap) for row in LAYOUT]
    placed = laid_out()
    return [row for row in rows if row.panels] + [Row(((n, ""),)) for n in shown if n not in placed]
