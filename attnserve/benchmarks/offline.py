"""What ``bench throughput`` and ``bench latency`` share: the engine under test, its facts, its roofline,
and the transformers baseline built from the same source afterwards.

Order within one run: measure the copy bandwidth (before anything else takes device memory), build the
engine, run it, free it, then build and run the baseline (on GPU the engine's KV cache would leave the
baseline no memory otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnserve.benchmarks.roofline import Roofline, kv_bytes_per_token, measure_copy_bandwidth
from attnserve.config import EngineConfig
from attnserve.model_executor.loader import ModelSource, resolve_model_source
from attnserve.refusals import Refused
from attnserve.refusals import bench as bench_words

BASELINES = ("transformers",)


@dataclass(frozen=True)
class EngineFacts:
    """What a result records about the engine, and what the baseline needs to be built the same way."""

    model: str  # the checkpoint path (the default model's GGUF when --model is not given)
    source: ModelSource
    hf_config: Any
    load_format: str
    seed: int
    device: torch.device
    dtype: torch.dtype
    attention_backend: str
    kv_cache_dtype: torch.dtype  # the cache's storage type (fp8 with --kv-cache-dtype fp8)
    block_size: int  # tokens per KV-cache block
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    prompt_vocab_size: int  # random prompt ids are drawn below this (model and tokenizer both know them)
    pad_token_id: int | None

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "load_format": self.load_format,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention_backend": self.attention_backend,
            "kv_cache_dtype": str(self.kv_cache_dtype).removeprefix("torch."),
            "block_size": self.block_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "torch": torch.__version__,
        }


def start_engine(config: EngineConfig):
    """Measure the copy bandwidth, build the engine; returns ``(engine, facts, roofline)``. The engine's warning
    that its KV cache holds fewer tokens than max_model_len waits for :func:`check_requests_fit`."""
    from attnserve.engine.llm_engine import LLMEngine
    from attnserve.platforms import detect_platform

    platform = detect_platform(config.device)
    device = (
        torch.device("cpu")
        if platform.device_type == "cpu"
        else torch.device(config.device if config.device.startswith("cuda") else "cuda")
    )
    bandwidth = measure_copy_bandwidth(device)
    from attnserve.benchmarks.hf_baseline import free_device_memory

    free_device_memory(device)  # the copy's 2 GiB, cached here, would stay out of the KV cache's reach
    engine = LLMEngine(config, warn_kv_cache_limit=False)
    info = engine.info
    tokenizer_size = len(engine.tokenizer) if engine.tokenizer is not None else engine.hf_config.vocab_size
    facts = EngineFacts(
        model=resolve_model_source(config.model.model).path,
        source=resolve_model_source(config.model.model),
        hf_config=engine.hf_config,
        load_format=config.model.load_format,
        seed=config.model.seed,
        device=info.device,
        dtype=info.dtype,
        attention_backend=info.backend_name,
        kv_cache_dtype=info.kv_dtype,
        block_size=engine.config.cache.block_size,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_num_batched_tokens=engine.config.scheduler.max_num_batched_tokens,
        max_model_len=engine.max_model_len,
        prompt_vocab_size=min(engine.hf_config.vocab_size, tokenizer_size),
        pad_token_id=engine.tokenizer.pad_token_id if engine.tokenizer is not None else None,
    )
    # per rank under tensor parallelism: each GPU reads its shard of the weights and KV cache in parallel
    roofline = Roofline(
        copy_bandwidth=bandwidth,
        weight_bytes=info.weight_bytes,
        kv_bytes_per_token=kv_bytes_per_token(info.num_layers, info.num_kv_heads, info.head_size, info.kv_dtype),
        expert_bytes=info.expert_bytes,
        num_experts=info.num_experts,
        experts_per_token=info.experts_per_token,
    )
    return engine, facts, roofline


def stop_engine(engine, facts: EngineFacts) -> None:
    """Drop the engine's model and KV cache (the caller drops its own reference too)."""
    from attnserve.benchmarks.hf_baseline import free_device_memory

    if engine.runner is not None:
        engine.runner.release()
    engine.shutdown()
    free_device_memory(facts.device)


def start_baseline(name: str, facts: EngineFacts):
    """The baseline ``name`` (only "transformers") built from the engine's source, dtype and device."""
    from attnserve.benchmarks.hf_baseline import TransformersBaseline

    if name not in BASELINES:
        raise Refused(bench_words.baseline_unknown(name, list(BASELINES)))
    return TransformersBaseline(
        facts.source, facts.hf_config, facts.load_format, facts.dtype, facts.device, facts.seed, facts.pad_token_id
    )


def check_requests_fit(engine, max_input: int) -> None:
    """Raise the scheduler's ConfigError (keyed to the KV-cache setting) if a prompt of ``max_input`` tokens can
    never fit the engine's KV cache; else log the engine's KV-cache warning, if it has one. So a benchmark whose
    prompts cannot fit prints one error line, not that warning and then the error."""
    engine.scheduler.check_prompt_fits(max_input)
    engine.warn_kv_cache_limit()


def check_lengths(max_input: int, max_output: int, max_model_len: int, flags: list[str]) -> None:
    """Every request must fit: the longest prompt plus the longest output within max_model_len; Refused (a
    ValueError) naming ``flags``, the flags that shaped the requests, otherwise."""
    if max_input + max_output > max_model_len:
        raise Refused(bench_words.too_long(max_input, max_output, max_model_len, flags))
