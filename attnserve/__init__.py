"""attnserve: an LLM inference and serving engine with pluggable attention backends.

Importing attnserve imports no kernel library and no server library.
"""

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.config import AttentionConfig, EngineConfig

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "AttentionConfig",
    "AttentionBackendEnum",
    "EngineConfig",
    "__version__",
]


def __getattr__(name: str):
    # LLM and SamplingParams load the engine (torch, transformers) only when asked for.
    if name == "LLM":
        from attnserve.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from attnserve.core.sampling_params import SamplingParams

        return SamplingParams
    if name == "StructuredOutputsParams":
        from attnserve.core.structured_outputs import StructuredOutputsParams

        return StructuredOutputsParams
    raise AttributeError(f"module 'attnserve' has no attribute {name!r}")
