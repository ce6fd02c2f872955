"""The capability checks every backend shares: declared limits vs. a selector config and platform.

Every reason carries the values involved (the given value and what is supported), so a user never has to
guess. Each reason is a :class:`~attnserve.refusals.Reason`: its text, and the field, value and rule it is about;
an empty list means usable.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import TYPE_CHECKING

from attnserve.attention.capabilities import BackendCapabilities, cc_str, dtype_name
from attnserve.refusals import Reason
from attnserve.refusals.backends import (
    build_lacks,
    feature_not_supported,
    not_installed,
    not_supported,
    with_build_note,
)

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.selector import AttentionSelectorConfig
    from attnserve.platforms.interface import Platform


@functools.lru_cache(maxsize=None)
def package_installed(module: str) -> bool:
    """Whether ``module`` (dotted names allowed) can be imported, without importing it.

    ``importlib.util.find_spec("a.b")`` would import package ``a``; for a kernel library that is slow and
    may fail, so a dotted name is looked up as a file or folder under the top package's search path.
    """
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if not rest:
        return True
    for location in spec.submodule_search_locations or ():
        path = os.path.join(location, *rest.split("."))
        if os.path.isdir(path) or os.path.isfile(path + ".py"):
            return True
    return False


def capability_reasons(
    caps: BackendCapabilities,
    cfg: "AttentionSelectorConfig",
    platform: "Platform",
    *,
    assume_installed: bool = False,
) -> list[Reason]:
    """Every reason the backend described by ``caps`` cannot run ``cfg`` on ``platform``.

    Examples: ``head_size 80 not supported (supported: 64, 128, 256)``,
    ``block_size 8 not supported (multiples of 16)``,
    ``compute capability 7.5 not supported (needs >= 8.0)``,
    ``not installed: pip install 'attnserve[flashinfer]'``.
    """
    q = caps.qualifier or ""
    reasons: list[Reason] = []
    if platform.device_type not in caps.device_types:
        reasons.append(not_supported("device", platform.device_type, ", ".join(caps.device_types)))
    cc = platform.compute_capability
    if platform.device_type == "cuda" and cc is not None and "cuda" in caps.device_types:
        lo, hi = caps.min_compute_capability, caps.max_compute_capability
        if (lo is not None and cc < lo) or (hi is not None and cc > hi):
            reasons.append(
                not_supported(
                    "compute_capability",
                    cc,
                    caps.compute_capability_rule(),
                    shown=cc_str(cc),
                    qualifier=q,
                    lead="needs ",
                    label="compute capability",
                )
            )
    if caps.required_package and not assume_installed and not package_installed(caps.required_package):
        reasons.append(not_installed(caps.required_package, caps.install_command()))
    if cfg.dtype not in caps.dtypes:
        names = ", ".join(dtype_name(d) for d in caps.dtypes)
        reasons.append(not_supported("dtype", cfg.dtype, names, shown=dtype_name(cfg.dtype), qualifier=q))
    if cfg.kv_cache_dtype not in caps.kv_cache_dtypes:
        reasons.append(
            not_supported("kv_cache_dtype", cfg.kv_cache_dtype, ", ".join(caps.kv_cache_dtypes), qualifier=q)
        )
    if not caps.head_size_ok(cfg.head_size):
        lead = "supported: " if caps.head_sizes is not None else ""
        reasons.append(not_supported("head_size", cfg.head_size, caps.head_size_rule(), qualifier=q, lead=lead))
    if not caps.block_size_ok(cfg.block_size):
        lead = "supported: " if caps.block_sizes is not None else ""
        reasons.append(not_supported("block_size", cfg.block_size, caps.block_size_rule(), qualifier=q, lead=lead))
    if cfg.sliding_window is not None and not caps.sliding_window:
        reasons.append(not_supported("sliding_window", cfg.sliding_window, qualifier=q))
    if cfg.logits_soft_cap is not None and not caps.logits_soft_cap:
        reasons.append(not_supported("logits_soft_cap", cfg.logits_soft_cap, qualifier=q))
    if cfg.has_sink and not caps.sinks:
        reasons.append(feature_not_supported("has_sink", True, "attention sinks", q))
    for switch, what in caps.build_refusals:
        reasons.append(build_lacks(what, switch, q))
    if cfg.attn_type not in caps.attn_types:
        names = ", ".join(t.value for t in caps.attn_types)
        reasons.append(
            not_supported(
                "attn_type", cfg.attn_type, names, shown=cfg.attn_type.value, qualifier=q, label="attention type"
            )
        )
    notes = dict(caps.build_limits)
    return [with_build_note(r, notes[r.field]) if r.field in notes else r for r in reasons]


def build_limited(reason: Reason) -> bool:
    """Whether ``reason`` is a limit of the installed library's build (a reason :func:`capability_reasons` made
    from ``build_limits`` or ``build_refusals``), not of the backend itself."""
    return isinstance(reason, Reason) and reason.build
