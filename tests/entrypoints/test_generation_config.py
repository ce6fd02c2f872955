"""--generation-config (default sampling values from generation_config.json, as vLLM reads them) and --max-logprobs,
through LLM on a tiny random Llama."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from attnserve import LLM, SamplingParams
from attnserve.config.fields import ConfigError
from attnserve.core.sampling_params import SamplingParamsError
from attnserve.model_executor.generation_config import read_generation_defaults

# a model creator's recommendation (Qwen3's numbers); do_sample and num_beams are no sampling values attnserve takes
GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "max_new_tokens": 5,
    "num_beams": 1,
}
EXPECTED = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "max_tokens": 5}
HAS_REPETITION_PENALTY = "repetition_penalty" in {f.name for f in dataclasses.fields(SamplingParams)}
KW = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)


@pytest.fixture(scope="module")
def generation_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("generation")
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return str(folder)


@pytest.fixture(scope="module")
def model_with_generation_config(tiny_model_dir, tmp_path_factory, generation_folder):
    """The tiny Llama with the generation config as its own (what ``auto`` reads)."""
    folder = tmp_path_factory.mktemp("llama_gen") / "model"
    shutil.copytree(tiny_model_dir("llama"), folder)
    shutil.copy(f"{generation_folder}/generation_config.json", folder / "generation_config.json")
    return str(folder)


def test_the_sampling_values_the_file_sets_count(generation_folder, tmp_path):
    assert read_generation_defaults(generation_folder) == EXPECTED
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "bos_token_id": 1}))
    assert read_generation_defaults(str(tmp_path)) == {}  # what save_pretrained writes for a fresh model
    assert read_generation_defaults(None) == {}


def test_auto_reads_the_models_own_and_vllm_ignores_it(model_with_generation_config, caplog):
    with caplog.at_level("WARNING"):
        llm = LLM(model_with_generation_config, **KW)
    expected = {k: v for k, v in EXPECTED.items() if k != "repetition_penalty" or HAS_REPETITION_PENALTY}
    assert llm.engine.generation_defaults == expected
    assert sum("default sampling values from" in r.getMessage() for r in caplog.records) == 1  # shown once
    # LLM.generate without SamplingParams takes them: max_new_tokens 5 instead of SamplingParams' 16
    (out,) = llm.generate("Hello")
    assert len(out.outputs[0].token_ids) <= 5
    params = llm.engine.default_sampling_params()
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.max_tokens) == (0.6, 0.95, 20, 0.05, 5)
    # explicit SamplingParams are used as given (vLLM's LLM too)
    (out,) = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 8
    plain = LLM(model_with_generation_config, generation_config="vllm", **KW)
    assert plain.engine.generation_defaults == {}
    assert plain.engine.default_sampling_params() == SamplingParams()


def test_a_folder_is_read_instead_of_the_models(tiny_model_dir, generation_folder):
    llm = LLM(tiny_model_dir("llama"), generation_config=generation_folder, **KW)
    assert llm.engine.generation_defaults["max_tokens"] == 5
    assert LLM(tiny_model_dir("llama"), **KW).engine.generation_defaults == {}  # its own has no sampling values


def test_a_generation_config_that_is_no_folder_or_no_json_is_refused(tmp_path):
    with pytest.raises(ConfigError) as e:
        LLM(generation_config=str(tmp_path / "missing"))
    assert e.value.path == ("generation_config",) and "is no folder" in str(e.value)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ConfigError) as e:
        read_generation_defaults(str(tmp_path))
    assert e.value.path == ("generation_config",) and "cannot be read" in str(e.value)


def test_max_logprobs_is_the_engines_limit(tiny_model_dir):
    llm = LLM(tiny_model_dir("llama"), max_logprobs=2, **KW)
    (out,) = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=2, logprobs=2))
    assert all(len(entry) >= 2 for entry in out.outputs[0].logprobs)
    with pytest.raises(SamplingParamsError) as e:
        llm.generate("Hello", SamplingParams(max_tokens=2, logprobs=3))
    assert (e.value.path, e.value.value, e.value.allowed) == (
        ("logprobs",),
        3,
        "integer in [0, 2], the engine's max_logprobs (--max-logprobs)",
    )
    assert not llm.engine.has_unfinished_requests()
    unlimited = LLM(tiny_model_dir("llama"), max_logprobs=-1, **KW)
    assert unlimited.engine.max_logprobs == 49152  # the vocabulary size
    SamplingParams(logprobs=100)  # SamplingParams alone has no upper limit: the engine's is the one
