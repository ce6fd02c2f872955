"""What ``attnserve backends`` needs to know about a model: its attention shape, read from the config only.

No weights are loaded. A model folder is read with ``transformers.AutoConfig.from_pretrained`` (local
files only). With no model, the default model's facts are used.
"""

from __future__ import annotations

import os
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


# SmolLM2-135M-Instruct's config.json: hidden_size 576, 9 heads, 3 KV heads, bfloat16. Used when the
# engine's model resolver is not available (see _default_model_folder).
DEFAULT_MODEL_FACTS = ModelAttentionFacts(
    source="SmolLM2-135M-Instruct (default model)", head_size=64, num_heads=9, num_kv_heads=3, dtype=torch.bfloat16)


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``. Raises ValueError listing the allowed names."""
    try:
        return _DTYPES[name.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"dtype {name!r} not allowed (allowed: {', '.join(_DTYPES)}, auto)") from None


def facts_from_hf_config(config, source: str) -> ModelAttentionFacts:
    """Read head size, head counts, dtype, sliding window and soft cap from a transformers config."""
    text = getattr(config, "get_text_config", lambda: config)()
    num_heads = text.num_attention_heads
    head_size = getattr(text, "head_dim", None) or text.hidden_size // num_heads
    num_kv_heads = getattr(text, "num_key_value_heads", None) or num_heads
    raw = getattr(text, "torch_dtype", None) or getattr(text, "dtype", None) or "float32"
    dtype = raw if isinstance(raw, torch.dtype) else parse_dtype(str(raw))
    window = getattr(text, "sliding_window", None)
    if not getattr(text, "use_sliding_window", True):  # Qwen2 carries a window it does not use
        window = None
    cap = getattr(text, "attn_logit_softcapping", None)
    return ModelAttentionFacts(source, int(head_size), int(num_heads), int(num_kv_heads), dtype,
                               int(window) if window else None, float(cap) if cap else None)


def _default_model_folder() -> str | None:
    """The default model's folder through the engine's resolver, when this build has it.

    MERGE NOTE: rewire to ``attnserve.model_executor.loader.resolve_model_source`` once its signature is
    settled; until then any failure falls back to DEFAULT_MODEL_FACTS.
    """
    try:
        from attnserve.model_executor.loader import resolve_model_source  # type: ignore[attr-defined]

        folder = resolve_model_source(None)
    except Exception:
        return None
    folder = str(getattr(folder, "path", folder))
    return folder if os.path.isfile(os.path.join(folder, "config.json")) else None


def read_model_facts(model: str | None) -> ModelAttentionFacts:
    """Facts of ``model`` (a folder with config.json), or of the default model when None.

    Raises ValueError for a path that is not a model folder.
    """
    if model is None:
        folder = _default_model_folder()
        if folder is None:
            return DEFAULT_MODEL_FACTS
        model = folder
    if not os.path.isdir(model) or not os.path.isfile(os.path.join(model, "config.json")):
        raise ValueError(f"--model {model!r} is not a model folder with a config.json "
                         f"(or pass --head-size, --num-heads, --num-kv-heads)")
    from transformers import AutoConfig

    return facts_from_hf_config(AutoConfig.from_pretrained(model, local_files_only=True), model)
