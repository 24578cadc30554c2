"""``python -m dsv4ctl``: the CLI (watch starts runbooks this way)."""

import sys

from .cli import main

sys.exit(main())
