"""Print the table of a saved GPU run: ``python -m benchmarks.gpu.report results.json``."""

from __future__ import annotations

import json
import sys

from tests.gpu.conftest import format_table

if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(format_table(json.load(f)))
