"""``python -m attnserve``: the attnserve command."""

import sys

from attnserve.entrypoints.cli.main import main

sys.exit(main())
