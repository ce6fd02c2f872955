"""An attention backend that cannot run the model is refused from the model's config alone: before the GGUF
parse, the tokenizer, the executor (worker processes) and the weights, with the selector's own message. So is
tensor parallelism for a model class without it."""

from __future__ import annotations

import pytest
import torch

from attnserve import LLM
from attnserve.attention import selector
from attnserve.attention.selector import AttentionSelectorConfig, NoUsableBackendError, select_attn_backend
from attnserve.config import build_engine_config
from attnserve.engine import llm_engine
from attnserve.entrypoints.cli.main import main
from attnserve.executor import loading
from attnserve.model_executor import model_runner, weights
from attnserve.platforms import detect_platform

# what an engine that refuses a backend must never reach: each is the entry point of one expensive stage
STAGES = [
    (weights, "gguf_reader"),  # the GGUF parse (vocab_size; the weights' tensor index): seconds
    (loading, "load_model_tokenizer"),
    (loading, "make_executor"),  # spawns the tensor-parallel workers
    (model_runner, "load_weights"),
]


@pytest.fixture
def stages_reached(monkeypatch) -> list[str]:
    """Replaces each stage with one that records its name and raises; the list of names reached."""
    reached: list[str] = []
    for module, name in STAGES:

        def stage(*args, _name=name, **kwargs):
            reached.append(_name)
            raise AssertionError(f"{_name} reached")

        monkeypatch.setattr(module, name, stage)
    return reached


@pytest.fixture
def default_config_cached() -> None:
    """The default model's config converted once into the GGUF cache (``gguf_cache.py``), as any earlier load
    leaves it: what the refusal may read. A fresh cache (this file run alone on a new machine) would otherwise
    convert it, through the GGUF parse the test forbids."""
    from attnserve.model_executor.loader import read_hf_config, resolve_model_source

    read_hf_config(resolve_model_source(None))


def _selector_message(backend: str, **selector_fields) -> str:
    """The message ``select_attn_backend`` itself gives for ``backend`` with these inputs on the CPU."""
    with pytest.raises(NoUsableBackendError) as e:
        select_attn_backend(backend, AttentionSelectorConfig(**selector_fields), detect_platform("cpu"))
    return str(e.value)


def test_the_default_model_is_refused_before_its_gguf_parse_tokenizer_and_weights(
    default_config_cached, stages_reached
):
    with pytest.raises(NoUsableBackendError) as e:
        LLM(device="cpu", attention_backend="FLASH_ATTN")
    assert str(e.value) == _selector_message("FLASH_ATTN", head_size=64, dtype=torch.float32)
    assert stages_reached == []


def test_a_head_size_the_backend_rejects_is_refused_before_the_weights(tiny_model_dir, stages_reached):
    """The tiny Llama's head size 16 (TRITON_ATTN needs >= 32) from its config.json alone."""
    with pytest.raises(NoUsableBackendError) as e:
        LLM(tiny_model_dir("llama"), device="cpu", attention_backend="TRITON_ATTN", block_size=32)
    message = _selector_message("TRITON_ATTN", head_size=16, dtype=torch.float32, block_size=32)
    assert str(e.value) == message and "head_size 16 not supported" in message
    assert stages_reached == []


def test_tensor_parallel_is_refused_with_rank_0s_heads_before_any_worker_starts(tiny_model_dir, stages_reached):
    """4 query / 2 KV heads on 2 ranks: each rank has 2 / 1, the record every worker would judge."""
    with pytest.raises(NoUsableBackendError) as e:
        LLM(tiny_model_dir("llama"), device="cpu", tensor_parallel_size=2, attention_backend="FLASH_ATTN")
    assert str(e.value) == _selector_message(
        "FLASH_ATTN", head_size=16, dtype=torch.float32, num_heads=2, num_kv_heads=1
    )
    assert stages_reached == []


def test_a_model_class_without_tensor_parallelism_is_refused_before_any_worker_starts(tiny_model_dir, stages_reached):
    with pytest.raises(ValueError) as e:
        LLM(tiny_model_dir("gpt2"), device="cpu", tensor_parallel_size=2)
    assert str(e.value) == (
        "tensor_parallel_size 2 not supported for GPT2LMHeadModel (tensor parallelism is built "
        "for the Llama family: Llama, Mistral, Qwen2, Qwen3, Gemma 2/3, and the MoE models)"
    )
    assert stages_reached == []


def test_the_cli_exits_2_with_the_one_line_before_loading(stages_reached, capsys):
    assert main(["generate", "--device", "cpu", "--attention-backend", "FLASH_ATTN"]) == 2
    message = _selector_message("FLASH_ATTN", head_size=64, dtype=torch.float32)
    assert message.startswith("attention backend FLASH_ATTN cannot run")  # the flag names it: not twice on the line
    assert capsys.readouterr().err == (
        f"attnserve generate: error: argument --attention-backend: {message.removeprefix('attention backend ')}\n"
    )
    assert stages_reached == []


def test_the_runner_reuses_the_engines_selection(tiny_model_dir, monkeypatch):
    """One selection per engine: the ModelRunner's call, with the same inputs, is the engine's cached answer."""
    judged, made = [], []
    select_explicit, select_model_attention = selector._select_explicit, loading.select_model_attention

    def counted_select_explicit(*args):
        judged.append(args)
        return select_explicit(*args)

    def recorded_select_model_attention(*args):
        made.append(select_model_attention(*args))
        return made[-1]

    monkeypatch.setattr(selector, "_select_explicit", counted_select_explicit)
    monkeypatch.setattr(loading, "select_model_attention", recorded_select_model_attention)
    selector.clear_backend_cache()
    config = build_engine_config(
        tiny_model_dir("llama"), device="cpu", attention_backend="CPU_ATTN", kv_cache_memory=8 << 20
    )
    runner = llm_engine.LLMEngine(config).runner
    assert len(judged) == 1  # the backend was validated once, by the engine's call
    ((group,),) = [m.groups for m in made]  # one engine call, one layer group
    assert group.selector_config == runner.selector_config and group.selection is runner.attn_selection
