"""`python -m explorer ...`: see explorer/apps/cli.py."""
import sys

from .apps.cli import main

sys.exit(main())
