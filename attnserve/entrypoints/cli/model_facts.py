"""What ``attnserve backends`` needs to know about a model: its attention shape, read from the config only.

No weights are loaded. A model folder is read with ``transformers.AutoConfig.from_pretrained`` (local
files only). With no model, the default model's facts are used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
           "float32": torch.float32, "float": torch.float32}


@dataclass(frozen=True)
class ModelAttentionFacts:
    """The attention facts of a model that backend selection depends on."""

    source: str  # folder, or a description of where the facts came from
    head_size: int
    num_heads: int | None  # None when only --head-size was given
    num_kv_heads: int | None
    dtype: torch.dtype  # the checkpoint dtype ("auto" resolves to it)
    sliding_window: int | None = None  # tokens
    logits_soft_cap: float | None = None


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``. Raises ValueError listing the allowed names."""
    try:
        return _DTYPES[name.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"dtype {name!r} not allowed (allowed: {', '.join(_DTYPES)}, auto)") from None


def read_model_facts(model: str | None) -> ModelAttentionFacts:
    """Facts of ``model`` (a folder, a .gguf file, or None for the default model), from its config only.

    Uses the engine's own resolver and the model class's ``dims`` so that ``backends`` judges exactly
    what the engine would run. Raises ValueError for a path that is no model or an unsupported architecture.
    """
    from attnserve.model_executor.loader import load_hf_config, resolve_model_source
    from attnserve.models.registry import get_model_class

    try:
        source = resolve_model_source(model, weights=False)  # a hub id: config and tokenizer only
    except FileNotFoundError as e:
        raise ValueError(f"--model: {e} (or pass --head-size, --num-heads, --num-kv-heads)") from None
    config = load_hf_config(source)
    dims = get_model_class(config).dims(config)
    raw = getattr(config, "dtype", None)
    dtype = raw if isinstance(raw, torch.dtype) else (parse_dtype(str(raw)) if raw else torch.bfloat16)
    if dtype not in (torch.float16, torch.bfloat16):  # "auto" on a GPU runs float32 checkpoints in bfloat16
        dtype = torch.bfloat16
    cap = getattr(config, "attn_logit_softcapping", None)
    return ModelAttentionFacts(source.path, dims.head_size, dims.num_heads, dims.num_kv_heads, dtype,
                               dims.sliding_window, float(cap) if cap else None)
