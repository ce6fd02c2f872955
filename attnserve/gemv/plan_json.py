"""A GemvPlan's measured choices as JSON-ready data, and back (what ``plan_cache`` writes and reads).

Each record (``choices.GemvChoice``, ``SiluMulChoice``, ``GreedyChoice``) becomes a dict of its fields, its
launch configuration (``GemvConfig``, ``GreedyHeadConfig``) a dict of that one's; floats are written as
Python's ``repr``, so they read back equal. :func:`plan_from_dict` raises ValueError (KeyError, TypeError
included) for data it cannot read. The Triton kernels' configuration classes are imported on reading.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnserve.gemv.choices import GemvChoice, GreedyChoice, SiluMulChoice
from attnserve.gemv.plan import GemvPlan

FORMAT = 1  # bump when the layout below changes


def _record(c: Any) -> dict[str, Any]:
    return dataclasses.asdict(c)  # the config dataclass inside becomes a dict too


def plan_to_dict(plan: GemvPlan) -> dict[str, Any]:
    """``plan``'s choices (not its installed methods) as JSON-ready data; ``seconds`` is the measuring time."""
    return {
        "format": FORMAT,
        "seconds": plan.seconds,
        "choices": [_record(c) for c in plan.choices.values()],
        "silu_mul": [_record(c) for c in plan.silu_mul.values()],
        "swiglu": [_record(c) for c in plan.swiglu.values()],
        "greedy": [_record(c) for c in plan.greedy.values()],
    }


def _read(cls: type, config_cls: type, d: dict[str, Any]) -> Any:
    cfg = d.get("config")
    record = cls(**{**d, "config": None if cfg is None else config_cls(**cfg)})
    if record.config is None and (getattr(record, "use_triton", False) or getattr(record, "use_fused", False)):
        raise ValueError(f"{cls.__name__} ({record.n}, {record.k}, {record.m}) chooses a kernel without its config")
    return record


def plan_from_dict(data: dict[str, Any]) -> GemvPlan:
    """The GemvPlan :func:`plan_to_dict` wrote (not installed); ValueError when ``data`` is not one."""
    from attnserve.kernels.triton_gemv_config import GemvConfig
    from attnserve.kernels.triton_greedy_head import GreedyHeadConfig

    try:
        if data["format"] != FORMAT:
            raise ValueError(f"plan format {data['format']!r}, not {FORMAT}")
        plan = GemvPlan(seconds=float(data["seconds"]))
        for c in (_read(GemvChoice, GemvConfig, d) for d in data["choices"]):
            plan.choices[(c.n, c.k, c.m)] = c
        for name in ("silu_mul", "swiglu"):
            table = getattr(plan, name)
            for c in (_read(SiluMulChoice, GemvConfig, d) for d in data[name]):
                table[(c.n, c.k, c.m)] = c
        for c in (_read(GreedyChoice, GreedyHeadConfig, d) for d in data["greedy"]):
            plan.greedy[c.m] = c
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a GEMV plan: {type(e).__name__}: {e}") from None
    return plan
