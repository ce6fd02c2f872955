"""Model, cache, scheduler, parallel and engine records: validation from field declarations."""

import pytest

from attnserve.config import CacheConfig, ConfigError, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig


@pytest.mark.parametrize(
    "cls, field, value, allowed",
    [
        (ModelConfig, "dtype", "float64", "auto, float32, float16, bfloat16, float, half"),
        (ModelConfig, "load_format", "pt", "auto, safetensors, gguf, dummy"),
        (ModelConfig, "max_model_len", 0, "integer >= 1, null"),
        (ModelConfig, "seed", 2**63, "integer in [-2^63, 2^63 - 1]"),
        (CacheConfig, "block_size", 0, "1, 2, 4, 8, 16, 32, 64, 128, 256"),
        (
            CacheConfig,
            "block_size",
            7,
            "1, 2, 4, 8, 16, 32, 64, 128, 256",
        ),  # was accepted: no backend's size, nor vLLM's
        (CacheConfig, "block_size", 512, "1, 2, 4, 8, 16, 32, 64, 128, 256"),
        (CacheConfig, "kv_cache_dtype", "int8", "auto, fp8, fp8_e4m3, fp8_e5m2"),
        (CacheConfig, "gpu_memory_utilization", 1.5, "number in (0, 1]"),
        (CacheConfig, "num_gpu_blocks", -1, "integer >= 1, null"),
        (SchedulerConfig, "max_num_seqs", 0, "integer >= 1"),
        (ParallelConfig, "tensor_parallel_size", 0, "integer >= 1"),
        (ParallelConfig, "distributed_executor_backend", "mpi", "mp, ray"),
    ],
)
def test_bad_value_names_field_value_allowed(cls, field, value, allowed):
    with pytest.raises(ConfigError) as e:
        cls(**{field: value})
    r = e.value.refusal
    assert (r.path, r.value, r.allowed, r.noun, e.value.key) == ((field,), value, allowed, None, field)


def test_bad_value_golden_line():
    with pytest.raises(ConfigError) as e:
        CacheConfig(block_size=7)
    assert str(e.value) == "block_size 7 not allowed (allowed: 1, 2, 4, 8, 16, 32, 64, 128, 256)"


BLOCKS = "1, 2, 4, 8, 16, 32, 64, 128, 256"


# a value of another type names its type and the one expected: "'16' not allowed (allowed: 1, 2, 4, 8, 16, ...)"
# denied what the list shows (found by a fresh-user trial)
@pytest.mark.parametrize(
    "cls, field, value, kind, noun, allowed",
    [
        (CacheConfig, "block_size", "16", "a string", "an integer", BLOCKS),
        (CacheConfig, "block_size", 16.0, "a float", "an integer", BLOCKS),
        (CacheConfig, "block_size", True, "a boolean", "an integer", BLOCKS),
        (CacheConfig, "gpu_memory_utilization", "0.5", "a string", "a number", "number in (0, 1]"),
        (CacheConfig, "kv_cache_dtype", 8, "an integer", "a string", "auto, fp8, fp8_e4m3, fp8_e5m2"),
        (ModelConfig, "model", 5, "an integer", "a string", "string, null"),
        (ModelConfig, "model", ["m"], "a list", "a string", "string, null"),
        (ModelConfig, "seed", "1", "a string", "an integer", "integer in [-2^63, 2^63 - 1]"),
        (ModelConfig, "max_model_len", {"a": 1}, "a mapping", "an integer", "integer >= 1, null"),
        (SchedulerConfig, "enable_chunked_prefill", "no", "a string", "a boolean", "true, false"),
        (SchedulerConfig, "async_scheduling", 1, "an integer", "a boolean", "true, false, null"),
        (ParallelConfig, "disable_custom_all_reduce", "yes", "a string", "a boolean", "true, false"),
        (
            EngineConfig,
            "device",
            0,
            "an integer",
            "a string",
            "auto, cpu, cuda, cuda:N, cuda:MAJOR.MINOR to plan for a simulated GPU",
        ),
    ],
)
def test_a_value_of_another_type_names_both_types(cls, field, value, kind, noun, allowed):
    with pytest.raises(ConfigError) as e:
        cls(**{field: value})
    r = e.value.refusal
    assert (r.path, r.value, r.kind, r.noun, r.allowed, e.value.key) == ((field,), value, kind, noun, allowed, field)


def test_a_value_of_another_type_golden_line():
    with pytest.raises(ConfigError) as e:
        CacheConfig(block_size="16")
    assert str(e.value) == f"block_size '16' is a string, not an integer (allowed: {BLOCKS})"


def test_custom_all_reduce_on_by_default():
    assert ParallelConfig().disable_custom_all_reduce is False
    assert ParallelConfig(disable_custom_all_reduce=True).disable_custom_all_reduce is True


def test_dtype_aliases_normalized():
    assert ModelConfig(dtype="half").dtype == "float16"
    assert ModelConfig(dtype="float").dtype == "float32"


def test_int_for_float_field_becomes_float():
    assert CacheConfig(gpu_memory_utilization=1).gpu_memory_utilization == 1.0


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:7", "cuda:9.0", "cuda:10.0"])
def test_devices(device):
    assert EngineConfig(device=device).device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "tpu", "cuda:9.", "cuda:9.0.1"])
def test_bad_device(device):
    with pytest.raises(ConfigError, match="allowed: auto, cpu, cuda, cuda:N"):
        EngineConfig(device=device)


def test_engine_config_rejects_wrong_section_type():
    with pytest.raises(ConfigError, match="^EngineConfig.cache .* is not a CacheConfig$"):
        EngineConfig(cache={"block_size": 16})  # type: ignore[arg-type]


def test_to_dict_is_json_ready():
    import json

    d = EngineConfig().to_dict()
    json.dumps(d)
    assert set(d) == {
        "model",
        "cache",
        "scheduler",
        "parallel",
        "attention",
        "device",
        "enforce_eager",
        "disable_cascade_attn",
        "use_skinny_gemm",
        "enable_pdl",
    }
    assert d["attention"]["backend"] is None


def test_engine_refuses_to_run_on_a_simulated_device():
    """cuda:9.0 is a planning device (attnserve backends/config): the engine says so before loading anything."""
    from attnserve.engine.llm_engine import LLMEngine

    with pytest.raises(ValueError, match="'cuda:9.0' is a simulated GPU .* the engine cannot run on it"):
        LLMEngine(EngineConfig(device="cuda:9.0"))


@pytest.mark.parametrize("cls", [ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, EngineConfig])
def test_unknown_keyword_is_a_config_error(cls):
    """As AttentionConfig(foo=1): the record's fields allowed and the closest, not the generated __init__'s TypeError."""
    import dataclasses

    with pytest.raises(ConfigError) as e:
        cls(foo=1)
    r = e.value.refusal
    assert (r.value, r.subject, r.key, r.suggestion) == ("foo", f"unknown {cls.__name__} field", "foo", None)
    assert r.allowed == ", ".join(f.name for f in dataclasses.fields(cls))
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(ConfigError) as e:
        cls(**{first + "x": 1})
    assert e.value.refusal.suggestion == first


def test_unknown_keyword_names_the_field_of_an_alias():
    with pytest.raises(ConfigError) as e:
        CacheConfig(num_gpu_blocks_override=8)  # vLLM's name: an engine argument, not the record's field
    assert e.value.refusal.suggestion == "num_gpu_blocks"
    assert CacheConfig(num_gpu_blocks=8).num_gpu_blocks == 8  # known keywords still build the record
    import pickle

    assert pickle.loads(pickle.dumps(EngineConfig())) == EngineConfig()
