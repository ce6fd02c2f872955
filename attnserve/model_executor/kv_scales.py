"""Per-layer fp8 KV-cache scales: read from the checkpoint, computed from the first prefill, or 1.0.

FP8 checkpoints made with llm-compressor (compressed-tensors) or NVIDIA ModelOpt carry one key scale and one
value scale per attention layer; the names differ by tool and version (vLLM's ``maybe_remap_kv_scale_name``
reads the same set):

* ``model.layers.N.self_attn.k_scale`` / ``v_scale`` (llm-compressor; also under ``...self_attn.attn.``);
* ``model.layers.N.self_attn.k_proj.k_scale`` / ``v_proj.v_scale`` (ModelOpt);
* ``model.layers.N.self_attn.k_proj.output_scale`` / ``v_proj.output_scale`` (older compressed-tensors);
* ``model.layers.N.self_attn.kv_scale`` (one scale for both; deprecated);
* ``q_scale`` in the same places (FLASHINFER quantizes the query with it).

A scale is the per-tensor factor of ``stored = x / scale``; a tensor of several values (per head) gives its
maximum, a safe per-tensor bound. :func:`split_kv_scales` takes them out of the weight stream (the models have no
parameter for them) and :class:`KVScales` says where each layer's scales came from.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from attnserve.attention.kv_cache_dtype import first_bad_kv_scale
from attnserve.refusals.backends import bad_kv_scale

if TYPE_CHECKING:
    from attnserve.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)
_runner_log = logging.getLogger("attnserve.model_executor.model_runner")  # apply_kv_scales: the runner's start-up log

# the layer index, then the scale's own name at the end of the tensor name
_SCALE_NAME = re.compile(r"\.(\d+)\..*?(?:\.([kvq])_proj\.output_scale|\.(kv|k|v|q)_scale)$")

CHECKPOINT, CALCULATED, DEFAULT = "checkpoint", "calculated", "default"


def kv_scale_name(name: str) -> tuple[int, tuple[str, ...]] | None:
    """``(layer index, ("k",) / ("v",) / ("q",) / ("k", "v"))`` for a checkpoint tensor that is an attention
    layer's fp8 scale, None for any other tensor (weight scales such as ``k_proj.weight_scale`` included)."""
    m = _SCALE_NAME.search(name)
    if m is None:
        return None
    which = m.group(2) or m.group(3)
    return int(m.group(1)), ("k", "v") if which == "kv" else (which,)


@dataclass
class KVScales:
    """Each layer's fp8 scales and their origin (``checkpoint``, ``calculated``, ``default`` = 1.0)."""

    source: str = DEFAULT
    k: dict[int, float] = field(default_factory=dict)  # layer index -> scale
    v: dict[int, float] = field(default_factory=dict)
    q: dict[int, float] = field(default_factory=dict)
    names: dict[tuple[int, str], str] = field(default_factory=dict)  # (layer, "k" / "v" / "q") -> tensor read

    def add(self, name: str, tensor) -> bool:
        """Record ``tensor`` if ``name`` is a KV scale (:func:`kv_scale_name`); whether it was."""
        parsed = kv_scale_name(name)
        if parsed is None:
            return False
        layer, which = parsed
        t = tensor[...] if not isinstance(tensor, torch.Tensor) else tensor  # a LazySlice reads it whole
        value = float(t.float().abs().max())
        for w in which:
            getattr(self, w)[layer] = value
            self.names[layer, w] = name
        self.source = CHECKPOINT
        return True

    def layer(self, index: int) -> tuple[float, float, float | None]:
        """``(k_scale, v_scale, q_scale or None)`` of layer ``index``; 1.0 where the checkpoint has none."""
        return self.k.get(index, 1.0), self.v.get(index, 1.0), self.q.get(index)


def split_kv_scales(weights: Iterable[tuple[str, object]], scales: KVScales) -> Iterator[tuple[str, object]]:
    """``weights`` without the KV-scale tensors, which go into ``scales`` as they pass."""
    for name, tensor in weights:
        if not scales.add(name, tensor):
            yield name, tensor


def checkpoint_has_kv_scales(folder: str | None) -> bool:
    """Whether a local safetensors folder holds KV-scale tensors (reads the files' headers only)."""
    if folder is None or not os.path.isdir(folder):
        return False
    from safetensors import safe_open

    from attnserve.model_executor.weights import safetensors_files

    for file in safetensors_files(folder):
        with safe_open(os.path.join(folder, file), framework="pt") as f:
            if any(kv_scale_name(n) for n in f.keys()):
                return True
    return False


def describe_kv_scales(kv_cache_dtype: str, calculate: bool, in_checkpoint: bool) -> str:
    """Where an fp8 cache's scales come from, in the start-up line's words: ``calculated from the first prefill``,
    ``from the checkpoint``, ``1.0 (no scales in the checkpoint)``; ``none (cache in the model dtype)`` for ``auto``."""
    if kv_cache_dtype == "auto":
        return "none (cache in the model dtype)"
    if calculate:
        return "calculated from the first prefill (calculate_kv_scales)"
    if in_checkpoint:
        return "from the checkpoint (k_scale/v_scale)"
    return "1.0 (no scales in the checkpoint)"


def kv_cache_summary(kv_cache_dtype: str, model_dtype: torch.dtype | str, calculate: bool, folder: str | None) -> dict:
    """What ``attnserve backends`` and ``attnserve config --explain`` say about the cache: its element type
    (``model_dtype`` for ``auto``; a name such as ``"auto"`` when the model's dtype is not resolved) and where an
    fp8 cache's scales come from (``folder``: a local safetensors checkpoint, its headers read for KV scales)."""
    from attnserve.attention.kv_cache_dtype import kv_cache_torch_dtype

    if kv_cache_dtype == "auto":
        dtype = str(model_dtype).removeprefix("torch.")
    else:
        dtype = str(kv_cache_torch_dtype(kv_cache_dtype, torch.bfloat16)).removeprefix("torch.")
    in_checkpoint = kv_cache_dtype != "auto" and not calculate and checkpoint_has_kv_scales(folder)
    return {
        "kv_cache_dtype": kv_cache_dtype,
        "dtype": dtype,
        "scales": describe_kv_scales(kv_cache_dtype, calculate, in_checkpoint),
    }


def apply_kv_scales(runner: ModelRunner, checkpoint: KVScales) -> str:
    """Give each layer's Impl its fp8 scales from the checkpoint; returns where the scales come from, in the
    start-up line's words. A 16-bit cache takes none; ``calculate_kv_scales`` overrides the checkpoint's."""
    cache = runner.config.cache
    if cache.kv_cache_dtype == "auto":
        if checkpoint.k or checkpoint.v:
            _runner_log.info(
                "The checkpoint's KV-cache scales are unused: the KV cache is %s (kv_cache_dtype auto)",
                str(runner.kv_dtype).removeprefix("torch."),
            )
        return describe_kv_scales("auto", False, False)
    if cache.calculate_kv_scales:
        return describe_kv_scales(cache.kv_cache_dtype, True, bool(checkpoint.k or checkpoint.v))
    given = set(checkpoint.k) | set(checkpoint.v)
    found = sorted(given & set(runner.attn_impls))
    if extra := sorted(given - set(runner.attn_impls)):  # read, but no layer of the model takes them
        names = sorted({n for (i, _), n in checkpoint.names.items() if i in extra})
        _runner_log.warning("KV-cache scales of layers the model does not have, unused: %s", ", ".join(names))
    for index, impl in runner.attn_impls.items():
        scales = checkpoint.layer(index)
        if bad := first_bad_kv_scale(*scales):  # a zero, negative or non-finite scale: named by its tensor
            raise ValueError(f"{checkpoint.names[index, bad[0].removesuffix('_scale')]}: {bad_kv_scale(*bad)}")
        impl.set_kv_scales(*scales)
    text = describe_kv_scales(cache.kv_cache_dtype, False, bool(found))
    if found and len(found) < len(runner.attn_impls):
        text += f" for {len(found)} of {len(runner.attn_impls)} layers, 1.0 for the others"
    return text
