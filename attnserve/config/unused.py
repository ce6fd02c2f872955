"""Settings given that change nothing where they run: warned once each when the config is resolved, as the
attention_config options of another backend are (``engine_args.log_unused_options_once``). Given means a flag or a
keyword, or a file's value away from the default (``engine_args.resolve``): a file written by ``attnserve config``
restates every default.

A setting that cannot work is refused (the selector refuses a split bound with FlashAttention 2 or 4); these would
run, the value just has nowhere to go:

- ``distributed_executor_backend`` at ``tensor_parallel_size`` 1: one rank runs in this process, no workers start;
- ``attention_config.flash_attn_max_num_splits_for_cuda_graph`` with ``enforce_eager``: it bounds CUDA-graph decode
  steps only, and none are captured;
- ``enable_pdl`` on CPU or a GPU of compute capability below 9.0: programmatic dependent launch is a CUDA launch
  option of Hopper and later;
- ``enforce_eager`` on CPU: CUDA graphs are captured on CUDA only;
- ``disable_custom_all_reduce`` at ``tensor_parallel_size`` 1 or on CPU: the custom all-reduce joins GPU ranks only;
- ``disable_cascade_attn`` with prefix caching off (cascade attention reads a prefix cached for several requests)
  or on CPU (no CPU backend has a cascade path);
- ``kv_cache_memory`` beside ``num_gpu_blocks``: the block count sets the cache's size;
- ``revision`` with a local model (a folder, a .gguf file, or the default model's GGUF): it picks a hub snapshot,
  and applies to ``tokenizer`` only when that names the model itself; ``download_dir`` there too, unless
  ``tokenizer`` is a hub id (downloaded into it).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Collection

from attnserve.config.engine import EngineConfig
from attnserve.refusals import spell_value

logger = logging.getLogger(__name__)

SPLITS = "attention_config.flash_attn_max_num_splits_for_cuda_graph"
ON_CPU = "programmatic dependent launch is a CUDA launch option, and this runs on CPU"
_SIMULATED = re.compile(r"^cuda:(\d+)\.(\d+)$")  # platforms' planning GPU (config imports no platforms)


def _no_pdl(device: str) -> str | None:
    """Why programmatic dependent launch cannot run for the device setting, or None where it can (or the device is
    none this machine has: refused elsewhere). ``auto`` and ``cuda``: the first / current GPU, if any."""
    text = device.strip().lower()
    if text == "cpu":
        return ON_CPU
    if m := _SIMULATED.match(text):
        cc = (int(m.group(1)), int(m.group(2)))
    else:
        import torch

        if not torch.cuda.is_available():
            return ON_CPU if text == "auto" else None
        index = int(text.split(":", 1)[1]) if text.startswith("cuda:") and text[5:].isdigit() else None
        if index is not None and index >= torch.cuda.device_count():
            return None
        cc = torch.cuda.get_device_capability(index)
    if cc[0] < 9:
        return f"programmatic dependent launch needs compute capability 9.0 or later, and this GPU's is {cc[0]}.{cc[1]}"
    return None


def _on_cpu(device: str) -> bool:
    """Whether the device setting runs on CPU: ``cpu``, or ``auto`` on a machine without CUDA."""
    text = device.strip().lower()
    if text == "cpu":
        return True
    if text != "auto":
        return False
    import torch

    return not torch.cuda.is_available()


def _cuda_only(config: EngineConfig, given: Collection[str]) -> dict[str, tuple[object, str]]:
    """CUDA graphs' and GPU ranks' switches given where they have nothing to switch."""
    out: dict[str, tuple[object, str]] = {}
    on_cpu = _on_cpu(config.device)
    if "enforce_eager" in given and config.enforce_eager and on_cpu:
        out["enforce_eager"] = (True, "this runs on CPU, where no CUDA graphs are captured")
    parallel = config.parallel
    if "disable_custom_all_reduce" in given and parallel.disable_custom_all_reduce:
        if parallel.tensor_parallel_size == 1:
            out["disable_custom_all_reduce"] = (True, "tensor_parallel_size is 1: there is no all-reduce")
        elif on_cpu:
            out["disable_custom_all_reduce"] = (True, "this runs on CPU, where ranks all-reduce over gloo")
    if "disable_cascade_attn" in given and config.disable_cascade_attn:
        if not config.cache.enable_prefix_caching:
            out["disable_cascade_attn"] = (True, "prefix caching is off, and cascade attention reads a cached prefix")
        elif on_cpu:
            out["disable_cascade_attn"] = (True, "this runs on CPU, whose attention backends have no cascade path")
    return out


def _local(model: str | None) -> str | None:
    """How the reason names a model that is not downloaded: the default model (None) or a path that exists (the
    loader takes a local path before a hub id); None for anything else (a hub id, or a path the loader refuses)."""
    if model is None:
        return "the default model is a local GGUF"
    if os.path.exists(os.path.expanduser(model)):
        return f"model {model!r} is a local path"
    return None


def _hub_settings(config: EngineConfig, given: Collection[str]) -> dict[str, tuple[object, str]]:
    """``revision`` / ``download_dir`` given where nothing is downloaded from the hub."""
    out: dict[str, tuple[object, str]] = {}
    model = config.model
    local = _local(model.model)
    if local is None:
        return out
    if "revision" in given and model.revision is not None:
        out["revision"] = (model.revision, f"{local}, and a revision picks a hub model's snapshot")
    tokenizer_local = model.tokenizer is None or _local(model.tokenizer) is not None
    if "download_dir" in given and model.download_dir is not None and tokenizer_local:
        out["download_dir"] = (model.download_dir, f"{local}, and only hub models are downloaded")
    return out


def unused_settings(config: EngineConfig, given: Collection[str]) -> dict[str, tuple[object, str]]:
    """Engine argument -> (its value, why it changes nothing) for each setting the user gave (``given``: the keys
    set, e.g. ``Resolved.chosen``; an attention option: set away from its default) that has no effect here."""
    out: dict[str, tuple[object, str]] = {}
    parallel = config.parallel
    if "distributed_executor_backend" in given and parallel.tensor_parallel_size == 1:
        out["distributed_executor_backend"] = (
            parallel.distributed_executor_backend,
            "tensor_parallel_size is 1: the model runs in this process, no workers start",
        )
    attention = config.attention
    field = SPLITS.split(".", 1)[1]
    splits = getattr(attention, field)
    if (
        config.enforce_eager
        and splits != type(attention).__dataclass_fields__[field].default
        and attention.flash_attn_version not in (2, 4)  # the selector refuses a split bound with these
        and field not in attention.unused_options()  # another backend's option: warned as such
    ):
        out[SPLITS] = (splits, "enforce_eager captures no CUDA graphs, and only CUDA-graph decode steps take the bound")
    if "enable_pdl" in given and config.enable_pdl and (why := _no_pdl(config.device)):
        out["enable_pdl"] = (True, why)
    cache = config.cache
    if "kv_cache_memory" in given and cache.kv_cache_memory is not None and cache.num_gpu_blocks is not None:
        out["kv_cache_memory"] = (cache.kv_cache_memory, "num_gpu_blocks sets the KV cache's size")
    out.update(_cuda_only(config, given))
    out.update(_hub_settings(config, given))
    return out


@functools.cache
def log_unused_setting_once(key: str, value: object, why: str) -> None:
    """Warn, once per setting, value and reason, that the setting has no effect."""
    logger.warning("%s %s has no effect: %s", key, spell_value(value), why)


def warn_unused_settings(config: EngineConfig, given: Collection[str]) -> None:
    """Log :func:`unused_settings`, each once per process."""
    for key, (value, why) in unused_settings(config, given).items():
        log_unused_setting_once(key, value, why)
