"""``python -m attnserve``: the ``attnserve`` command."""

from attnserve.entrypoints.cli.main import main

raise SystemExit(main())
