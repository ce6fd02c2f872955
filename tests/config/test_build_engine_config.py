"""The Python surface: build_engine_config(model, attention_backend=, attention_config=, **engine_kwargs)."""

import dataclasses
import json
import logging

import pytest

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.config import (
    AttentionConfig,
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    build_engine_config,
)
from attnserve.config import env as env_mod
from attnserve.config.engine_arg_table import engine_args

FA = AttentionBackendEnum.FLASH_ATTN
FI = AttentionBackendEnum.FLASHINFER


def test_defaults():
    assert build_engine_config() == EngineConfig()


def test_flat_kwargs_land_in_their_sections():
    cfg = build_engine_config(
        "m",
        dtype="bfloat16",
        block_size=32,
        max_model_len=4096,
        kv_cache_memory=1 << 30,
        num_gpu_blocks=100,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        device="cpu",
        enforce_eager=True,
        seed=3,
        load_format="dummy",
        tokenizer="tok",
        gpu_memory_utilization=0.5,
    )
    assert cfg == EngineConfig(
        model=ModelConfig(
            model="m", tokenizer="tok", dtype="bfloat16", max_model_len=4096, load_format="dummy", seed=3
        ),
        cache=CacheConfig(block_size=32, num_gpu_blocks=100, kv_cache_memory=1 << 30, gpu_memory_utilization=0.5),
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8),
        device="cpu",
        enforce_eager=True,
    )


def test_table_covers_every_field_once():
    names = {f"{a.section}.{a.name}" if a.section else a.name for a in engine_args().values()}
    expected = {"device", "enforce_eager", "disable_cascade_attn", "use_skinny_gemm", "enable_pdl"}
    for f in dataclasses.fields(EngineConfig):
        if dataclasses.is_dataclass(f.default_factory) and f.name != "attention":
            expected |= {f"{f.name}.{sf.name}" for sf in dataclasses.fields(f.default_factory)}
    assert names == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attention_backend": "FLASHINFER"},
        {"attention_backend": FI},
        {"attention_config": AttentionConfig(backend="flashinfer")},
        {"attention_config": {"backend": "FLASHINFER"}},
        {"attention_backend": "flashinfer", "attention_config": {"backend": "FLASHINFER"}},  # same backend: fine
        {"attention_backend": "FLASHINFER", "attention_config": AttentionConfig()},
    ],
)
def test_attention_surfaces(kwargs):
    assert build_engine_config("m", **kwargs).attention.backend is FI


def test_attention_config_dict_with_options():
    cfg = build_engine_config(attention_config={"backend": "flash_attn", "flash-attn-version": 4})
    assert cfg.attention == AttentionConfig(backend=FA, flash_attn_version=4)


def test_attention_backend_plus_options_object():
    cfg = build_engine_config(attention_backend="FLASH_ATTN", attention_config=AttentionConfig(flash_attn_version=3))
    assert cfg.attention == AttentionConfig(backend=FA, flash_attn_version=3)


@pytest.mark.parametrize(
    "ac",
    [AttentionConfig(backend="FLASH_ATTN"), {"backend": "FLASH_ATTN"}, {"backend": "auto"}],
)
def test_mutual_exclusion(ac):
    with pytest.raises(ConfigError) as e:
        build_engine_config(attention_backend="FLASHINFER", attention_config=ac)
    assert "attention_backend= 'FLASHINFER' conflicts with attention_config.backend" in str(e.value)


def test_block_size_outside_the_sizes_is_refused():
    """LLM(block_size=7) was accepted; vLLM's sizes (and 2, 4 for CPU) are, whatever the backend."""
    with pytest.raises(ConfigError) as e:
        build_engine_config(block_size=7)
    assert (e.value.path, e.value.value, e.value.allowed, e.value.key) == (
        ("block_size",),
        7,
        "1, 2, 4, 8, 16, 32, 64, 128, 256",
        "block_size",
    )
    assert build_engine_config(block_size=256).cache.block_size == 256


def test_unknown_kwarg_did_you_mean():
    with pytest.raises(ConfigError, match=r"unknown engine argument 'blocksize' .*did you mean 'block_size'\?"):
        build_engine_config(blocksize=16)


def test_unknown_kwarg_lists_and_suggests_vllm_names():
    """vLLM's names that LLM takes (kv_cache_memory_bytes, num_gpu_blocks_override) are among the valid ones, next
    to ours, and a near miss of one is suggested as written (was: ours only, 'did you mean 'kv_cache_memory'?')."""
    with pytest.raises(ConfigError) as e:
        build_engine_config(kv_cache_memory_byte=1 << 30)
    msg = str(e.value)
    assert ", num_gpu_blocks, num_gpu_blocks_override, kv_cache_memory, kv_cache_memory_bytes, " in msg
    assert "(allowed: tokenizer, " in msg and "'model'" not in msg and "attention_backend" not in msg
    assert msg.endswith("enable_pdl); did you mean 'kv_cache_memory_bytes'?")
    assert build_engine_config(num_gpu_blocks_override=7).cache.num_gpu_blocks == 7


def test_unknown_attention_dict_key():
    with pytest.raises(ConfigError, match=r"unknown attention_config field 'backnd'.*did you mean 'backend'\?"):
        build_engine_config(attention_config={"backnd": "FLASH_ATTN"})


def test_attention_config_of_wrong_type():
    with pytest.raises(ConfigError, match="is not an object of field names"):
        build_engine_config(attention_config="FLASH_ATTN")


def test_bad_value():
    with pytest.raises(ConfigError, match=r"^dtype 'float64' not allowed \(allowed: "):
        build_engine_config(dtype="float64")
    with pytest.raises(ConfigError, match="flash_attn_version 5 not allowed"):
        build_engine_config(attention_config={"flash_attn_version": 5})


def test_vllm_env_warned_once(monkeypatch, caplog):
    monkeypatch.setattr(env_mod, "_warned", set())
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASHINFER")
    monkeypatch.setenv("VLLM_FLASH_ATTN_VERSION", "3")
    with caplog.at_level(logging.WARNING, logger="attnserve.config"):
        cfg = build_engine_config()
        build_engine_config()
    assert cfg.attention.backend is None  # ignored
    msgs = [r.getMessage() for r in caplog.records if "is ignored by attnserve" in r.getMessage()]
    assert len(msgs) == 2
    assert any("VLLM_ATTENTION_BACKEND=FLASHINFER" in m and "--attention-backend FLASHINFER" in m for m in msgs)
    assert any("--attention-config.flash_attn_version 3" in m for m in msgs)


def test_unused_option_logged(caplog):
    from attnserve.config.engine_args import log_unused_options_once

    log_unused_options_once.cache_clear()  # once per process: an earlier test may have logged this pair
    with caplog.at_level(logging.WARNING, logger="attnserve.config"):
        build_engine_config(attention_backend="TRITON_ATTN", attention_config={"use_trtllm_attention": False})
    assert any("use_trtllm_attention" in r.getMessage() and "TRITON_ATTN" in r.getMessage() for r in caplog.records)


def test_vllm_env_advice_in_the_flags_spelling():
    """vLLM's booleans take 1/0, the flags true/false (1 is refused as an integer): the advice spells the flag's."""
    from attnserve.config.env import ignored_vllm_env

    got = ignored_vllm_env(
        {
            "VLLM_USE_TRTLLM_ATTENTION": "1",
            "VLLM_DISABLE_FLASHINFER_PREFILL": "0",
            "VLLM_V1_USE_PREFILL_DECODE_ATTENTION": "True",
            "VLLM_FLASHINFER_DISABLE_Q_QUANTIZATION": "yes",
            "VLLM_FLASH_ATTN_VERSION": "3",
        }
    )
    assert {name: v[2] for name, v in got.items()} == {
        "VLLM_V1_USE_PREFILL_DECODE_ATTENTION": "true",
        "VLLM_FLASH_ATTN_VERSION": "3",  # not a boolean: as given
        "VLLM_USE_TRTLLM_ATTENTION": "true",
        "VLLM_DISABLE_FLASHINFER_PREFILL": "false",
        "VLLM_FLASHINFER_DISABLE_Q_QUANTIZATION": "true|false",  # vLLM's meaning of 'yes' is not ours to guess
    }
    assert got["VLLM_USE_TRTLLM_ATTENTION"][:2] == ("1", "--attention-config.use_trtllm_attention")
    for _, flag, value in got.values():  # each advised value is one the flag takes (a flag's value is JSON-decoded)
        if value != "true|false":
            build_engine_config(attention_config={flag.split(".", 1)[1]: json.loads(value)})


def test_empty_vllm_env_is_unset(monkeypatch, caplog):
    """VLLM_ATTENTION_BACKEND= (empty) is unset, as vLLM reads it: no warning with a blank value."""
    from attnserve.config.env import ignored_vllm_env

    assert ignored_vllm_env({"VLLM_ATTENTION_BACKEND": "", "VLLM_FLASH_ATTN_VERSION": " "}) == {}
    monkeypatch.setattr(env_mod, "_warned", set())
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "")
    with caplog.at_level(logging.WARNING, logger="attnserve.config"):
        build_engine_config()
    assert not [r for r in caplog.records if "VLLM_ATTENTION_BACKEND" in r.getMessage()]
