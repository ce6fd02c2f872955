"""Hugging Face ``architectures`` name -> model class path, imported lazily."""

from __future__ import annotations

import importlib

from attnserve.config.fields import ConfigError
from attnserve.refusals import models as words

MODEL_REGISTRY: dict[str, str] = {
    "Gemma2ForCausalLM": "attnserve.models.gemma.Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "attnserve.models.gemma.Gemma3ForCausalLM",
    "GPT2LMHeadModel": "attnserve.models.gpt2.GPT2LMHeadModel",
    "GptOssForCausalLM": "attnserve.models.gpt_oss.GptOssForCausalLM",
    "LlamaForCausalLM": "attnserve.models.llama.LlamaForCausalLM",
    "MistralForCausalLM": "attnserve.models.llama.LlamaForCausalLM",
    "MixtralForCausalLM": "attnserve.models.mixtral.MixtralForCausalLM",
    "OPTForCausalLM": "attnserve.models.opt.OPTForCausalLM",
    "Qwen2ForCausalLM": "attnserve.models.qwen.Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "attnserve.models.qwen.Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "attnserve.models.qwen3_moe.Qwen3MoeForCausalLM",
}


# model_type -> architecture, for configs that name no architectures (those read from GGUF metadata)
MODEL_TYPE_ARCHITECTURES: dict[str, str] = {
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_oss": "GptOssForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "opt": "OPTForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


class UnsupportedArchitectureError(ValueError):
    """The checkpoint's architecture has no model class here."""


def get_model_class(config, tensor_parallel_size: int = 1) -> type:
    """The model class for ``config.architectures``; raises UnsupportedArchitectureError naming it, and
    ConfigError (a ValueError keyed ``tensor_parallel_size``) when ``tensor_parallel_size`` > 1 and the class is
    not built for tensor parallelism."""
    archs = list(getattr(config, "architectures", None) or [])
    if not archs and getattr(config, "model_type", None) in MODEL_TYPE_ARCHITECTURES:
        archs = [MODEL_TYPE_ARCHITECTURES[config.model_type]]
    for arch in archs:
        if arch in MODEL_REGISTRY:
            module, _, name = MODEL_REGISTRY[arch].rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            if tensor_parallel_size > 1 and not getattr(cls, "supports_tensor_parallel", False):
                raise ConfigError(words.no_tensor_parallel(tensor_parallel_size, cls.__name__))
            return cls
    raise UnsupportedArchitectureError(
        words.architecture_not_supported(archs or getattr(config, "model_type", None), list(MODEL_REGISTRY))
    )
