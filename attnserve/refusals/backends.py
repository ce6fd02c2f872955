"""The words of an attention backend that cannot run a model: the selector's :class:`~attnserve.refusals.Reason`
records (field, value, rule) with their text, and the refusal of a backend choice or of a layout.

``attention/validation.py``, ``selector.py``, ``registry.py`` and the backends word their reasons here.
"""

from __future__ import annotations

from attnserve.refusals import Reason, Refusal

# ---------------------------------------------------------------- a backend's reasons (attention/validation.py, ...)


def not_supported(
    field: str,
    value: object,
    rule: str = "",
    *,
    shown: object = None,
    qualifier: str = "",
    lead: str = "supported: ",
    label: str | None = None,
) -> Reason:
    """A backend's reason: ``FIELD VALUE not supported[ with QUALIFIER][ (LEAD RULE)]``, e.g. ``head_size 80 not
    supported (supported: 64, 128, 256)``, ``compute capability 7.5 not supported (needs >= 8.0)``; ``shown``: the
    value as written (``float32`` for a torch dtype), ``label``: the words for the field when not its name."""
    text = f"{field if label is None else label} {value if shown is None else shown} not supported"
    text += (f" with {qualifier}" if qualifier else "") + (f" ({lead}{rule})" if rule else "")
    return Reason(text, field, value, rule)


def not_installed(package: str, install_command: str, why: str = "") -> Reason:
    """``not installed: pip install ...[ (why)]``."""
    return Reason(
        f"not installed: {install_command}" + (f" ({why})" if why else ""), "package", package, install_command
    )


def separate_calls(backend: str) -> Reason:
    """The reason of a backend that always runs decodes and prefills in separate calls (CPU_ATTN, TRITON_ATTN) for
    ``attention_config.use_prefill_decode_attention``: the field would change nothing."""
    return Reason(
        f"use_prefill_decode_attention not supported: {backend} always runs decodes and prefills in separate calls",
        "use_prefill_decode_attention",
        True,
        "false",
    )


def trtllm_needs_blackwell(where: str) -> Reason:
    """FlashInfer's ``use_trtllm_attention=True`` on a device of compute capability ``where`` (not 10.x)."""
    return Reason(
        f"use_trtllm_attention=True needs compute capability 10.x (this device: {where}): "
        "FlashInfer's TRT-LLM kernels exist for Blackwell only",
        "use_trtllm_attention",
        True,
        "compute capability 10.x",
    )


TRTLLM_NOT_WIRED = Reason(
    "use_trtllm_attention=True not supported: FlashInfer's TRT-LLM kernels are not wired in attnserve (unset or "
    "false runs FlashInfer's own kernels)",
    "use_trtllm_attention",
    True,
    "null, false",
)


def cannot_be_loaded(backend: str, error: Exception) -> Reason:
    """A backend class whose import failed."""
    return Reason(f"cannot be loaded: {error}", "package", backend, str(error))


def feature_not_supported(field: str, value: object, words: str, qualifier: str = "") -> Reason:
    """A model feature the backend lacks, in ``words`` (``attention sinks``): ``attention sinks not supported``."""
    return Reason(f"{words} not supported" + (f" with {qualifier}" if qualifier else ""), field, value)


def build_lacks(what: str, switch: str, qualifier: str = "") -> Reason:
    """The installed library was built without a kernel every call needs (``switch``: its compile-time switch)."""
    return Reason(
        f"no {what} in the installed build{qualifier} ({switch})", "build", switch, f"a build without {switch}", True
    )


BUILD_NOTE = "this build: "


def with_build_note(reason: Reason, switches: str) -> Reason:
    """``reason`` naming the build switches behind its limit, in its text and at the end of its rule."""
    note = BUILD_NOTE + switches
    rule = f"{reason.rule}; {note}" if reason.rule else note
    return Reason(f"{reason}; {note}", reason.field, reason.value, rule, True)


# ---------------------------------------------------------------- FlashAttention's versions (backends/flash_attn*.py)


def install_extras(extras: list[str], package: str) -> Reason:
    """No FlashAttention version installed: ``not installed: pip install 'attnserve[fa3]' (or 'attnserve[fa2]')``."""
    quoted = [f"'attnserve[{e}]'" for e in extras]
    command = f"pip install {quoted[0]}" + (f" (or {', '.join(quoted[1:])})" if len(quoted) > 1 else "")
    return Reason(f"not installed: {command}", "package", package, command)


def graph_splits_need_fa3(splits: int, version: int) -> Reason:
    return Reason(
        f"flash_attn_max_num_splits_for_cuda_graph {splits} not supported with flash_attn_version "
        f"{version} (FlashAttention 3's split plan only)",
        "flash_attn_max_num_splits_for_cuda_graph",
        splits,
        "flash_attn_version 3",
    )


def version_not_on_gpu(version: int, cc: tuple[int, int] | None, shown: str, rule: str) -> Reason:
    """``flash_attn_version`` set to a version whose kernels do not run on this GPU (``shown``: its capability)."""
    where = f"compute capability {shown}" if cc else "this device"
    return Reason(
        f"flash_attn_version {version} not supported on {where} (FlashAttention {version} needs {rule})",
        "compute_capability",
        cc,
        rule,
    )


def version_not_installed(version: int, extra: str, package: str) -> Reason:
    return Reason(
        f"flash_attn_version {version} not installed: pip install 'attnserve[{extra}]'",
        "package",
        package,
        f"pip install 'attnserve[{extra}]'",
    )


UNKNOWN_CAPABILITY = Reason(
    "compute capability unknown (FlashAttention needs a CUDA GPU)", "compute_capability", None, "a CUDA GPU"
)


def capability_below(cc: tuple[int, int], shown: str, lowest: str) -> Reason:
    return Reason(
        f"compute capability {shown} not supported (needs >= {lowest})", "compute_capability", cc, f">= {lowest}"
    )


def capability_between(cc: tuple[int, int], shown: str, rules: dict[int, str]) -> Reason:
    """A GPU no FlashAttention version runs on, with each version's rule."""
    ranges = "; ".join(f"FlashAttention {n}: {rule}" for n, rule in rules.items())
    return Reason(f"compute capability {shown} not supported ({ranges})", "compute_capability", cc, ranges)


def no_version_installed(cc: object) -> str:
    return (
        f"no FlashAttention version installed for compute capability {cc}: pip install 'attnserve[fa3]' (or fa4, fa2)"
    )


def version_unknown(version: object) -> str:
    return f"flash_attn_version {version} not supported (supported: 2, 3, 4)"


# ---------------------------------------------------------------- choosing a backend (attention/selector.py, registry.py)


def cannot_run(name: str, model: str, device: str, reasons: list[str], working: list[str]) -> Refusal:
    """An explicitly chosen backend that cannot run the model; ``working``: the backends that would."""
    would = f"Backends that would work: {', '.join(working)}" if working else "No backend would work"
    return Refusal(
        subject="attention backend",
        key="attention_config.backend",
        reason=f"{name} cannot run this model ({model}) on {device}: " + "; ".join(reasons) + f". {would}.",
    )


def no_backend(model: str, device: str, tried: dict[str, list[str]], key: str | None) -> Refusal:
    """No backend of the platform's priority list can run the model; backends with the same reasons listed once."""
    same: dict[tuple[str, ...], list[str]] = {}
    for name, why in tried.items():
        same.setdefault(tuple(" ".join(r.split()) for r in why), []).append(name)
    listing = ". ".join(f"{', '.join(names)}: {'; '.join(why)}" for why, names in same.items())
    return Refusal(reason=f"no attention backend can run this model ({model}) on {device}: {listing}.", key=key)


def layout_conflict(requested: str, name: str, required: str) -> str:
    return (
        f"kv_cache_layout {requested} conflicts with attention backend {name}, which requires "
        f"{required}; drop the explicit layout or choose another backend"
    )


def sinks_not_in_kernel(backend: str) -> Refusal:
    return Refusal(("attention_backend",), backend, reason="attention sinks not supported by this backend's kernel")


def bad_kv_scale(name: str, value: object) -> str:
    return f"{name} {value} not allowed (allowed: a positive finite number)"


NEEDS_A_NAME = "register_backend needs a backend name"


def no_class_registered(name: str) -> str:
    return f"attention backend {name} has no class registered; use register_backend({name}, ...)"


def module_lacks(module: str, attr: str) -> str:
    return f"module {module!r} has no attribute {attr!r}"


def unknown_backend(name: str, valid: list[str], suggestion: str | None) -> Refusal:
    """A backend name that is neither an enum member nor registered (``lookup_backend``)."""
    return Refusal(
        value=name,
        allowed=f"{', '.join(valid)}, auto",
        reason="",
        subject="unknown attention backend",
        suggestion=suggestion,
    )
