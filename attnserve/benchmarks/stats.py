"""Small helpers shared by the benchmarks: percentiles, device synchronization, JSON output."""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

import numpy as np
import torch

PERCENTILES = (50, 90, 99)


def summarize(values: Iterable[float]) -> dict[str, float | None]:
    """mean, min, max and p50/p90/p99 (numpy's linear interpolation) of ``values``; None when empty."""
    xs = np.asarray(list(values), dtype=np.float64)
    if xs.size == 0:
        return {"mean": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}}
    return {
        "mean": float(xs.mean()),
        "min": float(xs.min()),
        "max": float(xs.max()),
        **{f"p{p}": float(np.percentile(xs, p)) for p in PERCENTILES},
    }


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a host timer measures it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    """perf_counter after synchronizing ``device``."""
    synchronize(device)
    return time.perf_counter()


def write_json(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
