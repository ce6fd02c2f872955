"""EngineConfig: the engine's one configuration object, passed explicitly through the engine."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from attnserve.config.attention import AttentionConfig
from attnserve.config.cache import CacheConfig
from attnserve.config.fields import ConfigError, refuses_unknown_keywords, validate_fields
from attnserve.config.model import ModelConfig
from attnserve.config.parallel import ParallelConfig
from attnserve.config.scheduler import SchedulerConfig
from attnserve.refusals import Refusal
from attnserve.refusals.devices import device_words
from attnserve.refusals.config import not_a_record

DEVICES = ("auto", "cpu", "cuda")
DEVICE_WORDS = device_words(DEVICES)


@refuses_unknown_keywords()
@dataclass(frozen=True)
class EngineConfig:
    """Model, cache, scheduler, parallel and attention settings, plus the device and CUDA-graph switch."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    device: str = field(default="auto", metadata={"words": DEVICE_WORDS})
    """Device: auto (cuda when available, else cpu), cpu, cuda or cuda:N. For planning only
    (``attnserve backends``, ``attnserve config``): cuda:MAJOR.MINOR, a simulated GPU of that compute
    capability such as cuda:9.0; the engine refuses to run on it."""

    enforce_eager: bool = False
    """Never capture CUDA graphs; run every step eagerly."""

    disable_cascade_attn: bool = False
    """Never run cascade attention. By default, with prefix caching on and a backend that has it (FLASH_ATTN
    version 3, 16-bit KV cache, no sliding window), a CUDA-graph decode step whose requests share at least 256
    tokens of leading KV blocks reads that shared prefix once for all of them instead of once per request
    (``attnserve/attention/cascade.py``), as vLLM does."""

    use_skinny_gemm: bool | None = None
    """CUDA graphs only: decode steps of up to 64 requests run each linear layer and the LM head through a
    Triton GEMV (a skinny GEMM past 16 rows) where, timed against cuBLAS at start-up for each weight shape
    and captured batch size (1, 2, 4, 8, 16, 32, 48, 64), it is at least 5% faster (vLLM's name for its
    small-batch GEMMs, VLLM_ROCM_USE_SKINNY_GEMM); in the MLP's down projection, also a GEMV that computes
    the SwiGLU itself (one launch instead of two) where that is 5% faster than the SwiGLU kernel and the best
    plain choice; cuBLASLt instead of cuBLAS where it is 2% faster; and, for steps whose requests are all
    greedy without logprobs, an LM head that keeps only each row's largest logit and its index (no logits
    written, no argmax pass) where that is 5% faster than the LM head + argmax. The first start measures
    (the timing and ~70 Triton compiles); the choices are saved under $ATTNSERVE_CACHE_DIR/gemv (else
    $XDG_CACHE_HOME/attnserve or ~/.cache/attnserve), keyed by GPU, software versions, dtype, shapes and
    code, so a later start with the same key loads them. Default (null): on where it applies (a CUDA
    device, CUDA graphs, Triton installed), off elsewhere; true warns where it has no effect. Figures:
    docs/benchmarks.md."""

    enable_pdl: bool = True
    """Launch attnserve's Triton kernels (RMSNorm, RoPE + KV-cache write, SwiGLU, the skinny-GEMM GEMV) with
    programmatic dependent launch on GPUs of compute capability 9.0 and later: each may start while the
    kernel before it still runs and waits in-kernel for its inputs (``attnserve/kernels/pdl.py``), so launch
    latency between kernels overlaps work; the results are the same bits. Off on CPU and older GPUs (given there:
    warned once)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(f.default_factory) and not isinstance(value, f.default_factory):  # type: ignore[arg-type]
                raise ConfigError(not_a_record(value, f.name, f.default_factory))  # type: ignore[arg-type]
        validate_fields(self)
        if self.device not in DEVICES and not re.fullmatch(r"cuda:\d+(\.\d+)?", self.device):
            raise ConfigError(Refusal(("device",), self.device, DEVICE_WORDS))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict: one object per sub-config, the attention backend as its name."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, AttentionConfig):
                out[f.name] = value.to_dict()
            elif dataclasses.is_dataclass(value):
                out[f.name] = dataclasses.asdict(value)
            else:
                out[f.name] = value
        return out
