"""Default sampling values from a model's ``generation_config.json`` (vLLM's ``--generation-config``).

    defaults = generation_defaults(config.model, source)   # {"temperature": 0.6, "top_k": 20, "max_tokens": 512}

``auto`` reads the model's own folder, a folder path reads that folder, ``vllm`` reads nothing. As in vLLM
(``ModelConfig.get_diff_sampling_param``), the values are ``GenerationConfig.to_diff_dict()``'s (transformers 5:
every value the file sets; 4.x: those that differ from its defaults), only these keys: temperature, top_p, top_k,
min_p, repetition_penalty, and max_new_tokens, renamed max_tokens. A request (or ``LLM.generate``'s SamplingParams) that
sets a field keeps its value; ``max_tokens`` is a cap (vLLM takes the smallest of the request's, the context's
room and this one).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from attnserve.config.fields import ConfigError
from attnserve.config.model import ModelConfig
from attnserve.refusals import models as words

logger = logging.getLogger(__name__)

# vLLM's available_params, in its order; max_new_tokens is transformers' name for max_tokens
SAMPLING_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def generation_config_folder(config: ModelConfig, model_folder: str | None) -> str | None:
    """The folder ``config.generation_config`` reads, None for ``vllm`` (and for ``auto`` on a model without a folder
    of its own: a GGUF file carries no generation config)."""
    choice = config.generation_config
    if choice == "vllm":
        return None
    return model_folder if choice == "auto" else os.path.expanduser(choice)  # ModelConfig checked it is a folder


def read_generation_defaults(folder: str | None, choice: str = "auto") -> dict[str, Any]:
    """The sampling values of ``folder``'s generation_config.json (``to_diff_dict``), as SamplingParams names
    (``max_new_tokens`` -> ``max_tokens``); {} without a folder or file. Raises ConfigError keyed to
    generation_config (``choice``: its value) for a file transformers cannot read."""
    path = os.path.join(folder, "generation_config.json") if folder is not None else None
    if path is None or not os.path.isfile(path):
        return {}
    from transformers import GenerationConfig

    try:
        diff = GenerationConfig.from_pretrained(folder).to_diff_dict()
    except (OSError, ValueError) as e:  # malformed JSON, values transformers refuses
        raise ConfigError(words.generation_config_unreadable(choice, path, e)) from None
    values = {key: diff[key] for key in SAMPLING_KEYS if diff.get(key) is not None}
    if "max_new_tokens" in values:
        values["max_tokens"] = values.pop("max_new_tokens")
    return values


def generation_defaults(
    config: ModelConfig,
    model_folder: str | None,
    known: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The default sampling values ``config`` asks for (see the module docstring), logged once when there are any.

    ``model_folder``: the model's own folder (None for a GGUF file). ``known``: the SamplingParams fields this engine
    has; a value for another field (repetition_penalty before SamplingParams has it) is left out, and the log line
    says so."""
    folder = generation_config_folder(config, model_folder)
    values = read_generation_defaults(folder, config.generation_config)
    if not values:
        return {}
    dropped = sorted(k for k in values if known is not None and k not in known)
    used = {k: v for k, v in values.items() if k not in dropped}
    logger.warning(
        "default sampling values from %s: %s (under a request's own values and max_tokens as a cap in the server "
        "and attnserve generate; LLM.generate uses them only when given no SamplingParams; "
        "--generation-config vllm ignores them)%s",
        os.path.join(folder, "generation_config.json"),
        used,
        f"; not applied, attnserve has no such sampling parameter: {', '.join(dropped)}" if dropped else "",
    )
    return used
