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


def _qual(caps: BackendCapabilities) -> str:
    return f" with {caps.qualifier}" if caps.qualifier else ""


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
    q = _qual(caps)
    reasons: list[Reason] = []
    if platform.device_type not in caps.device_types:
        supported = ", ".join(caps.device_types)
        reasons.append(
            Reason(
                f"device {platform.device_type} not supported (supported: {supported})",
                "device",
                platform.device_type,
                supported,
            )
        )
    cc = platform.compute_capability
    if platform.device_type == "cuda" and cc is not None and "cuda" in caps.device_types:
        lo, hi = caps.min_compute_capability, caps.max_compute_capability
        if (lo is not None and cc < lo) or (hi is not None and cc > hi):
            rule = caps.compute_capability_rule()
            reasons.append(
                Reason(
                    f"compute capability {cc_str(cc)} not supported{q} (needs {rule})", "compute_capability", cc, rule
                )
            )
    if caps.required_package and not assume_installed and not package_installed(caps.required_package):
        reasons.append(
            Reason(f"not installed: {caps.install_command()}", "package", caps.required_package, caps.install_command())
        )
    if cfg.dtype not in caps.dtypes:
        names = ", ".join(dtype_name(d) for d in caps.dtypes)
        reasons.append(
            Reason(f"dtype {dtype_name(cfg.dtype)} not supported{q} (supported: {names})", "dtype", cfg.dtype, names)
        )
    if cfg.kv_cache_dtype not in caps.kv_cache_dtypes:
        names = ", ".join(caps.kv_cache_dtypes)
        reasons.append(
            Reason(
                f"kv_cache_dtype {cfg.kv_cache_dtype} not supported{q} (supported: {names})",
                "kv_cache_dtype",
                cfg.kv_cache_dtype,
                names,
            )
        )
    if not caps.head_size_ok(cfg.head_size):
        rule = caps.head_size_rule()
        rule = f"supported: {rule}" if caps.head_sizes is not None else rule
        reasons.append(Reason(f"head_size {cfg.head_size} not supported{q} ({rule})", "head_size", cfg.head_size, rule))
    if not caps.block_size_ok(cfg.block_size):
        rule = caps.block_size_rule()
        rule = f"supported: {rule}" if caps.block_sizes is not None else rule
        reasons.append(
            Reason(f"block_size {cfg.block_size} not supported{q} ({rule})", "block_size", cfg.block_size, rule)
        )
    if cfg.sliding_window is not None and not caps.sliding_window:
        reasons.append(
            Reason(f"sliding_window {cfg.sliding_window} not supported{q}", "sliding_window", cfg.sliding_window)
        )
    if cfg.logits_soft_cap is not None and not caps.logits_soft_cap:
        reasons.append(
            Reason(f"logits_soft_cap {cfg.logits_soft_cap} not supported{q}", "logits_soft_cap", cfg.logits_soft_cap)
        )
    if cfg.has_sink and not caps.sinks:
        reasons.append(Reason(f"attention sinks not supported{q}", "has_sink", True))
    for switch, what in caps.build_refusals:
        reasons.append(
            Reason(f"no {what} in the installed build{q} ({switch})", "build", switch, f"a build without {switch}")
        )
    if cfg.attn_type not in caps.attn_types:
        names = ", ".join(t.value for t in caps.attn_types)
        reasons.append(
            Reason(
                f"attention type {cfg.attn_type.value} not supported{q} (supported: {names})",
                "attn_type",
                cfg.attn_type,
                names,
            )
        )
    notes = dict(caps.build_limits)
    return [_build_limited(r, notes[r.field]) if r.field in notes else r for r in reasons]


BUILD_NOTE = "this build: "


def _build_limited(reason: Reason, switches: str) -> Reason:
    """``reason`` naming the build switches behind its limit, in its text and at the end of its rule."""
    note = BUILD_NOTE + switches
    rule = f"{reason.rule}; {note}" if reason.rule else note
    return Reason(f"{reason}; {note}", reason.field, reason.value, rule)


def build_limited(reason: Reason) -> bool:
    """Whether ``reason`` is a limit of the installed library's build (a reason :func:`capability_reasons` made
    from ``build_limits`` or ``build_refusals``), not of the backend itself."""
    return isinstance(reason, Reason) and (reason.field == "build" or BUILD_NOTE in reason.rule)
