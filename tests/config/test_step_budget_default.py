"""The step token budget's default: vLLM's choice by device memory and entry point, filled in before loading."""

import pytest

from attnserve.config import EngineConfig
from attnserve.config.scheduler import SchedulerConfig, default_max_num_batched_tokens
from attnserve.engine.llm_engine import LLMEngine, resolve_step_budget
from attnserve.refusals import Refused

GIB = 1 << 30


@pytest.mark.parametrize(
    "device_type, memory, usage, expected",
    [
        ("cuda", 141 * GIB, "llm", 16384),  # H200
        ("cuda", 141 * GIB, "server", 8192),
        ("cuda", 80 * GIB, "llm", 16384),  # H100
        ("cuda", 24 * GIB, "llm", 8192),
        ("cuda", 24 * GIB, "server", 2048),
        ("cuda", None, "llm", 8192),
        ("cpu", None, "llm", 2048),
        ("cpu", None, "server", 2048),
    ],
)
def test_default_budget(device_type, memory, usage, expected):
    assert default_max_num_batched_tokens(device_type, memory, usage) == expected


def test_unset_budget_is_filled_for_the_device():
    config = EngineConfig(device="cpu")
    assert config.scheduler.max_num_batched_tokens is None
    assert resolve_step_budget(config, "llm").scheduler.max_num_batched_tokens == 2048


def test_explicit_budget_is_kept():
    config = EngineConfig(device="cpu", scheduler=SchedulerConfig(max_num_batched_tokens=512))
    assert resolve_step_budget(config, "server") is config


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_an_unknown_usage_is_refused_on_every_device(device_type):
    with pytest.raises(Refused) as e:
        default_max_num_batched_tokens(device_type, 141 * GIB, "serve")
    assert (e.value.path, e.value.value, e.value.allowed) == (("usage",), "serve", "'llm', 'server'")


def test_the_engine_refuses_an_unknown_usage_before_loading():
    with pytest.raises(Refused) as e:
        LLMEngine(EngineConfig(device="cpu", scheduler=SchedulerConfig(max_num_batched_tokens=512)), usage="serve")
    assert e.value.path == ("usage",) and e.value.value == "serve"
