"""`python -m engine.report --write | --check`: regenerate or check widgets/_schema.js, the panels'
copy of the record schema (engine/report/schema.py)."""
import sys

from .schema import main

sys.exit(main())
