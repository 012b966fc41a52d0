"""The Dashboard's layout as data, read by the Dashboard and the one-file export alike (no
widget here, so the export's view code also runs where only Python does: a docs page's Pyodide)."""
from __future__ import annotations

# The Dashboard's panels in the order it lays them out; a registered panel these do not name
# (widgets.PANELS: a new widgets/<name>.py) follows them, at the bottom (`dashboard_panels`).
PANEL_NAMES = ("controls", "queues", "sampler", "why", "blocks", "slots", "tree", "attention", "timeline", "latency")
ON_DEMAND = ("tensor_parallel",)  # shown only where there is something to see (sharding)
POOL_KEYS = ("num_kv_blocks", "block_size")   # the controls' pool fields (a new engine)
