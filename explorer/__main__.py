"""`python -m explorer ...`: see explorer/cli.py."""
import sys

from .cli import main

sys.exit(main())
