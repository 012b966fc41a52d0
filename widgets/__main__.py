"""`python -m widgets --write | --check`: regenerate or check widgets/_panels.js, the panels'
field lists for the browser, from their state classes (widgets/_state.py)."""
import sys

from . import STATEFUL_PANELS
from ._state import main

sys.exit(main(STATEFUL_PANELS, sys.argv[1:]))
