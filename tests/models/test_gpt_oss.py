"""gpt-oss on CPU: what the tiny-model comparison with transformers (``test_tiny_models.py``) does not show: the
sinks matter, a backend without sinks is refused at selection with that reason, MXFP4 checkpoints and (before
per-layer attention groups) layers mixing windows are refused from the config, TP=2 equals TP=1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.refusals import Refused
from tests.helpers import hf_greedy, hf_reference, pin_swiglu_to_config

ENGINE = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)
PROMPT = list(range(300, 330))  # 30 tokens: past the window of 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _with_config(src: str, dst: Path, **changes) -> str:
    """A copy of the tiny model folder ``src`` (links to its files) whose config.json has ``changes``."""
    dst.mkdir()
    for f in Path(src).iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f)
    config = json.loads((Path(src) / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    return str(dst)


def test_sinks_change_the_tokens(tiny_model_dir):
    """Guard: the same model with its sinks at -inf (no sink) gives other logits than with them, and transformers
    agrees with attnserve on both."""
    path = tiny_model_dir("gpt_oss_sw")
    hf = hf_reference(path)
    llm = LLM(path, attention_backend="CPU_ATTN", **ENGINE)
    with_sinks = llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    assert with_sinks == hf_greedy(hf, PROMPT, 10)[0]
    for layer in llm.engine.runner.model.layers:
        layer.self_attn.sinks.data.fill_(-1e4)
    llm.reset_prefix_cache()  # its blocks hold K/V computed with the sinks
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
    without = llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    assert without == hf_greedy(hf, PROMPT, 10)[0]
    assert without != with_sinks


def test_swiglu_limit_is_the_configs(tiny_model_dir, tmp_path):
    """The tiny models' ``swiglu_limit`` 0.5 clamps: the same weights with 7.0 (what transformers up to 5.17 uses
    whatever the config says) give other tokens, and each equals the reference pinned to its config. Guard for the
    reference: ``pin_swiglu_to_config`` restores the config's limit on experts built with the hard-coded one."""
    path = tiny_model_dir("gpt_oss")
    limit7 = _with_config(path, tmp_path / "limit7", swiglu_limit=7.0)
    tokens = {}
    for name, folder in (("0.5", path), ("7.0", limit7)):
        hf = hf_reference(folder)
        tokens[name] = LLM(folder, **ENGINE).generate([PROMPT], GREEDY)[0].outputs[0].token_ids
        assert tokens[name] == hf_greedy(hf, PROMPT, 10)[0], name
    assert tokens["0.5"] != tokens["7.0"]
    experts = [layer.mlp.experts for layer in hf.model.layers]  # the 7.0 model's
    for e in experts:
        e.limit = 0.5  # another limit than its config's, as an older transformers sets a fixed one
    assert pin_swiglu_to_config(hf) == len(experts) and {e.limit for e in experts} == {7.0}
    assert pin_swiglu_to_config(hf) == 0


def test_flex_attention_sinks_match_transformers(tiny_model_dir):
    path = tiny_model_dir("gpt_oss_sw")
    hf = hf_reference(path)
    llm = LLM(path, attention_backend="FLEX_ATTENTION", **ENGINE)
    assert llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids == hf_greedy(hf, PROMPT, 10)[0]


def test_backend_without_sinks_is_refused_at_selection(tiny_model_dir):
    """The model's dims carry the sinks into the selector config, where a backend without them is refused."""
    from transformers import AutoConfig

    from attnserve.attention.backends.cpu_attn import CPUAttentionBackend
    from attnserve.config import build_engine_config
    from attnserve.model_executor.attention_selection import attention_selector_configs
    from attnserve.platforms import detect_platform

    class NoSinkBackend(CPUAttentionBackend):
        name = "NO_SINK"
        supports_sinks = False

    path = tiny_model_dir("gpt_oss")
    [(_, _, cfg)] = attention_selector_configs(
        build_engine_config(path, **ENGINE), AutoConfig.from_pretrained(path), "cpu", 1
    )
    assert cfg.has_sink
    reasons = NoSinkBackend.validate(cfg, detect_platform("cpu"))
    assert [str(r) for r in reasons] == ["attention sinks not supported"]
    assert CPUAttentionBackend.validate(cfg, detect_platform("cpu")) == []


def test_mxfp4_checkpoint_is_refused(tiny_model_dir, tmp_path):
    path = _with_config(tiny_model_dir("gpt_oss"), tmp_path / "mxfp4", quantization_config={"quant_method": "mxfp4"})
    with pytest.raises(Refused) as e:
        LLM(path, **ENGINE)
    assert e.value.refusal.path == ("quantization_config", "quant_method") and e.value.refusal.value == "mxfp4"


def test_tp2_matches_tp1(tiny_model_dir):
    """Sinks narrowed to each rank's heads, the stacked expert tensors to each rank's columns."""
    path = tiny_model_dir("gpt_oss_sw")
    prompts = [PROMPT, [5, 6, 7], [42]]
    reference = [o.outputs[0].token_ids for o in LLM(path, **ENGINE).generate(prompts, GREEDY)]
    llm = LLM(path, tensor_parallel_size=2, **ENGINE)
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == reference
    finally:
        llm.engine.shutdown()
