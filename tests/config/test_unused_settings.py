"""Settings given that do nothing where they run are warned about once (``attnserve/config/unused.py``)."""

import logging

import pytest

from attnserve.config.engine_args import build_engine_config, resolve
from attnserve.config.unused import SPLITS, log_unused_setting_once, unused_settings


def unused(**kwargs):
    settings = kwargs.pop("settings", None)
    config = build_engine_config(**kwargs)
    return unused_settings(config, settings if settings is not None else kwargs)


def test_executor_backend_at_one_rank():
    got = unused(distributed_executor_backend="ray")
    assert list(got) == ["distributed_executor_backend"] and got["distributed_executor_backend"][0] == "ray"
    assert unused(distributed_executor_backend="mp", tensor_parallel_size=2) == {}
    assert unused() == {}  # not given: the default is not the user's


def test_split_bound_without_cuda_graphs():
    splits = {"flash_attn_max_num_splits_for_cuda_graph": 64}
    got = unused(enforce_eager=True, attention_config=splits, settings=[])
    assert list(got) == [SPLITS] and got[SPLITS][0] == 64
    assert unused(attention_config=splits, settings=[]) == {}  # CUDA graphs: the bound applies
    # refused by the selector with FlashAttention 2, warned as another backend's option with FLASHINFER
    assert unused(enforce_eager=True, attention_config={**splits, "flash_attn_version": 2}, settings=[]) == {}
    assert unused(enforce_eager=True, attention_backend="FLASHINFER", attention_config=splits, settings=[]) == {}


def test_pdl_on_cpu():
    assert list(unused(enable_pdl=True, device="cpu")) == ["enable_pdl"]
    assert unused(enable_pdl=True, device="cuda:9.0") == {}
    assert unused(enable_pdl=True, device="cuda:10.0") == {}
    assert unused(enable_pdl=False, device="cpu") == {}  # off is what runs
    assert unused(device="cpu", settings=["device"]) == {}  # the default, not given


def test_pdl_before_hopper():
    """PDL needs compute capability 9.0: on an Ampere or Ada GPU (simulated for planning) it is warned as on CPU."""
    for device in ("cuda:8.0", "cuda:8.9"):
        got = unused(enable_pdl=True, device=device)
        assert list(got) == ["enable_pdl"] and got["enable_pdl"][0] is True
        assert got["enable_pdl"][1].startswith("programmatic dependent launch needs compute capability 9.0")
    assert unused(device="cuda:8.0", settings=["device"]) == {}  # the default, not given


def test_cuda_graph_and_gpu_rank_switches_where_nothing_uses_them():
    got = unused(enforce_eager=True, device="cpu")
    assert list(got) == ["enforce_eager"] and got["enforce_eager"][0] is True
    assert unused(enforce_eager=True, device="cuda:9.0") == {}  # a GPU: no graphs captured, as asked
    assert list(unused(disable_custom_all_reduce=True)) == ["disable_custom_all_reduce"]  # one rank
    got = unused(disable_custom_all_reduce=True, tensor_parallel_size=2, device="cpu")
    assert got["disable_custom_all_reduce"][1].startswith("this runs on CPU")
    assert unused(disable_custom_all_reduce=True, tensor_parallel_size=2, device="cuda:9.0") == {}
    assert list(unused(disable_cascade_attn=True, enable_prefix_caching=False)) == ["disable_cascade_attn"]
    # prefix caching on, a GPU: cascade steps would run; on CPU no backend has a cascade path
    assert unused(disable_cascade_attn=True, device="cuda:9.0") == {}
    got = unused(disable_cascade_attn=True, device="cpu")
    assert list(got) == ["disable_cascade_attn"] and got["disable_cascade_attn"][1].startswith("this runs on CPU")


def test_kv_cache_memory_beside_a_block_count():
    got = unused(kv_cache_memory=1 << 30, num_gpu_blocks=600)
    assert list(got) == ["kv_cache_memory"] and got["kv_cache_memory"][0] == 1 << 30
    assert unused(kv_cache_memory=1 << 30) == {}  # the budget sizes the cache
    assert unused(num_gpu_blocks=600) == {}


def test_warned_once_when_resolved(caplog):
    from attnserve.config.settings import Setting

    log_unused_setting_once.cache_clear()
    s = Setting("distributed_executor_backend", "ray", "python", "distributed_executor_backend=")
    with caplog.at_level(logging.WARNING, logger="attnserve.config"):
        resolve([s])
        resolve([s])
    msgs = [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()]
    assert msgs == [
        "distributed_executor_backend 'ray' has no effect: tensor_parallel_size is 1: the model runs in this "
        "process, no workers start"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--enable-pdl", "--device", "cpu"],
        ["--enforce-eager", "--device", "cpu"],
        ["--distributed-executor-backend", "ray"],
    ],
)
def test_the_command_line_warns(argv, capsys, caplog):
    from attnserve.entrypoints.cli.main import main

    log_unused_setting_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="attnserve.config"):
        assert main(["config", *argv]) in (0, None)
    assert sum("has no effect" in r.getMessage() for r in caplog.records) == 1


def test_a_written_config_file_read_back_warns_of_nothing(tmp_path, capsys, caplog):
    """`attnserve config` writes every default (enable_pdl true, distributed_executor_backend mp): read back on
    CPU at one rank they are not the user's choices, so none is warned about; a flag is (the flag restating a
    default too: --enable-pdl above)."""
    from attnserve.entrypoints.cli.main import main

    assert main(["config", "--device", "cpu"]) in (0, None)
    path = tmp_path / "c.json"
    path.write_text(capsys.readouterr().out)
    log_unused_setting_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="attnserve.config"):
        assert main(["config", "--config", str(path)]) in (0, None)
        assert not [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()]
        assert main(["config", "--config", str(path), "--enforce-eager"]) in (0, None)
    assert [r.getMessage().split(" ", 1)[0] for r in caplog.records if "has no effect" in r.getMessage()] == [
        "enforce_eager"
    ]


def test_hub_options_with_a_local_model(tmp_path):
    """--revision / --download-dir pick and place a hub download: with a local model nothing is downloaded."""
    got = unused(revision="main", download_dir=str(tmp_path))  # the default model
    assert {k: v[0] for k, v in got.items()} == {"revision": "main", "download_dir": str(tmp_path)}
    assert got["revision"][1].startswith("the default model is a local GGUF")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    got = unused(model=str(gguf), revision="v1")
    assert list(got) == ["revision"] and got["revision"][1].startswith(f"model {str(gguf)!r} is a local path")
    assert list(unused(model=str(tmp_path), download_dir="/data/hf")) == ["download_dir"]  # a folder
    # a hub tokenizer is downloaded into download_dir; revision applies to it only when it names the model
    assert list(unused(model=str(tmp_path), tokenizer="org/tok", download_dir="/d", revision="v1")) == ["revision"]
    assert unused(model="org/name", revision="v1", download_dir="/d") == {}  # a hub id: both apply
    assert unused(model=str(tmp_path)) == {}  # neither given
