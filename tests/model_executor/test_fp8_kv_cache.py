"""fp8 KV cache end to end on CPU: checkpoint scales, calculated scales, the start-up line, twice the blocks."""

from __future__ import annotations

import logging
import shutil
from types import SimpleNamespace

import pytest
import torch

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.attention.kv_cache_dtype import K_SCALE_CONSTANT, Q_SCALE_CONSTANT, V_SCALE_CONSTANT
from attnserve.attention.layer import Attention
from attnserve.attention.registry import AttentionBackendEnum
from attnserve.model_executor.kv_scales import KVScales, kv_scale_name

RUNNER_LOG = "attnserve.model_executor.model_runner"


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("model.layers.0.self_attn.k_scale", (0, ("k",))),
        ("model.layers.3.self_attn.v_scale", (3, ("v",))),
        ("model.layers.1.self_attn.attn.k_scale", (1, ("k",))),
        ("model.layers.2.self_attn.k_proj.k_scale", (2, ("k",))),  # ModelOpt
        ("model.layers.2.self_attn.v_proj.v_scale", (2, ("v",))),
        ("model.layers.5.self_attn.k_proj.output_scale", (5, ("k",))),  # older compressed-tensors
        ("model.layers.5.self_attn.v_proj.output_scale", (5, ("v",))),
        ("model.layers.7.self_attn.kv_scale", (7, ("k", "v"))),  # deprecated: one for both
        ("model.layers.0.self_attn.q_scale", (0, ("q",))),
        ("transformer.h.4.attn.k_scale", (4, ("k",))),
        ("model.layers.0.self_attn.k_proj.weight_scale", None),  # fp8 weights' scales are not KV scales
        ("model.layers.0.self_attn.k_proj.input_scale", None),
        ("model.layers.0.mlp.down_proj.output_scale", None),
        ("model.layers.0.self_attn.k_proj.weight", None),
    ],
)
def test_kv_scale_names(name, parsed):
    assert kv_scale_name(name) == parsed


def _folder_with_scales(tiny_model_dir, tmp_path, **extra) -> str:
    """The tiny Llama (2 layers) plus a safetensors file of KV scales in two tools' spellings (``extra``: more
    tensors, by name)."""
    from safetensors.torch import save_file

    folder = tmp_path / "llama_fp8_scales"
    shutil.copytree(tiny_model_dir("llama"), folder)
    save_file(
        {
            "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
            "model.layers.0.self_attn.v_scale": torch.tensor(0.25),
            "model.layers.1.self_attn.k_proj.output_scale": torch.tensor([0.125]),
            "model.layers.1.self_attn.v_proj.output_scale": torch.tensor([2.0, 4.0]),
            **extra,
        },  # per head: the max
        str(folder / "kv_scales.safetensors"),
    )
    return str(folder)


def test_a_bad_checkpoint_scale_names_its_tensor(tiny_model_dir, tmp_path):
    folder = _folder_with_scales(tiny_model_dir, tmp_path, **{"model.layers.0.self_attn.k_scale": torch.tensor(0.0)})
    with pytest.raises(ValueError) as e:
        _llm(folder, kv_cache_dtype="fp8")
    assert (
        str(e.value) == "model.layers.0.self_attn.k_scale: k_scale 0.0 not allowed (allowed: a positive finite number)"
    )


def test_scales_of_layers_the_model_lacks_are_not_counted(tiny_model_dir, tmp_path, caplog):
    """A scale for layer 7 of a 2-layer model is warned about and unused; layer 1 has none: the start-up line says
    the checkpoint's scales cover 1 of 2 layers."""
    from safetensors.torch import save_file

    folder = tmp_path / "partial"
    shutil.copytree(tiny_model_dir("llama"), folder)
    save_file(
        {"model.layers.0.self_attn.k_scale": torch.tensor(0.5), "model.layers.7.self_attn.k_scale": torch.tensor(2.0)},
        str(folder / "kv_scales.safetensors"),
    )
    with caplog.at_level(logging.INFO, logger=RUNNER_LOG):
        llm = _llm(str(folder), kv_cache_dtype="fp8")
    assert _scales(llm) == [(0.5, 1.0), (1.0, 1.0)]
    assert "KV-cache scales of layers the model does not have, unused: model.layers.7.self_attn.k_scale" in caplog.text
    assert "for 1 of 2 layers, 1.0 for the others" in caplog.text


def _llm(model, **kw):
    from attnserve import LLM

    return LLM(model, device="cpu", attention_backend="CPU_ATTN", dtype="bfloat16", kv_cache_memory=1 << 20, **kw)


def _scales(llm) -> list[tuple[float, float]]:
    impls = llm.engine.runner.attn_impls
    return [(impls[i].k_scale, impls[i].v_scale) for i in sorted(impls)]


def test_checkpoint_kv_scales_reach_each_layer(tiny_model_dir, tmp_path, caplog):
    from attnserve import SamplingParams

    folder = _folder_with_scales(tiny_model_dir, tmp_path)
    with caplog.at_level(logging.INFO, logger=RUNNER_LOG):
        llm = _llm(folder, kv_cache_dtype="fp8")
    assert _scales(llm) == [(0.5, 0.25), (0.125, 4.0)]
    assert "fp8 scales from the checkpoint (k_scale/v_scale)" in caplog.text
    assert all(spec.kv_cache_dtype == "fp8" for spec in llm.engine.runner.layer_specs)
    out = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    # a 16-bit cache takes no scales, and says so
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=RUNNER_LOG):
        auto = _llm(folder)
    assert _scales(auto) == [(1.0, 1.0), (1.0, 1.0)]
    assert "checkpoint's KV-cache scales are unused" in caplog.text
    assert "fp8 scales none (cache in the model dtype)" in caplog.text


def test_fp8_cache_holds_twice_the_blocks_of_bf16_in_the_same_budget(tiny_model_dir, caplog):
    counts = {}
    for kv in ("auto", "fp8", "fp8_e5m2"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=RUNNER_LOG):
            llm = _llm(tiny_model_dir("llama"), kv_cache_dtype=kv)
        counts[kv] = llm.engine.runner.num_blocks
        line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache:"))
        assert line.startswith(f"KV cache: {counts[kv]} blocks of 16 tokens (")
        assert ("bfloat16" if kv == "auto" else {"fp8": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}[kv]) in line
        if kv != "auto":
            assert "fp8 scales 1.0 (no scales in the checkpoint)" in line
        assert llm.engine.runner.kv_caches[0].dtype == llm.engine.runner.kv_dtype
    # 2 layers x K and V x 16 tokens x 2 KV heads x head 16: 4096 bytes in bf16, 2048 in fp8; 1 MiB budget
    assert counts == {"auto": 256, "fp8": 512, "fp8_e5m2": 512}


def test_calculate_kv_scales_on_the_first_prefill(tiny_model_dir, caplog):
    from attnserve import SamplingParams

    with caplog.at_level(logging.INFO, logger=RUNNER_LOG):
        llm = _llm(tiny_model_dir("llama"), kv_cache_dtype="fp8", calculate_kv_scales=True)
    assert "fp8 scales calculated from the first prefill" in caplog.text
    impls = llm.engine.runner.attn_impls.values()
    assert all(i.kv_scales_pending for i in impls) and _scales(llm) == [(1.0, 1.0)] * 2
    llm.generate([[1, 2, 3, 4, 5, 6, 7]], SamplingParams(temperature=0, max_tokens=3))
    assert not any(i.kv_scales_pending for i in impls)
    assert all(k != 1.0 and v != 1.0 for k, v in _scales(llm))


@pytest.mark.parametrize("with_rope", [False, True])
def test_calculated_scales_follow_vllms_rule(with_rope):
    """scale = amax / 200 for keys and queries, amax / 100 for values, of the step's (rotated) tensors."""
    from attnserve.attention.backend import CommonAttentionMetadata
    from attnserve.layers.rotary import RotaryEmbedding

    backend = AttentionBackendEnum.CPU_ATTN.get_class()
    spec = AttentionLayerSpec(num_heads=4, head_size=16, scale=0.25, num_kv_heads=2, kv_cache_dtype="fp8")
    impl = backend.get_impl_cls()(spec)
    impl.kv_scales_pending = True
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, h, 16, generator=gen) * 7 for h in (4, 2, 2))
    qsl, seq = torch.tensor([0, 5], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    common = CommonAttentionMetadata(
        qsl, qsl, seq, seq, torch.zeros(1, 1, dtype=torch.int32), torch.arange(5), 1, 5, 5, 5, 0, 0, 16
    )
    batch = SimpleNamespace(
        kv_caches=[torch.zeros(2, 1, 16, 2, 16, dtype=torch.float8_e4m3fn)],
        attn_metadata=backend.get_builder_cls()(spec, torch.device("cpu"), torch.float32).build(common),
    )
    layer = Attention(impl, 0)
    if with_rope:
        rope = RotaryEmbedding(16, 64, 10000.0).inputs(torch.arange(5))
        q_rot, k_rot = q.clone(), k.clone()
        rope.apply(q_rot, k_rot)
        layer.forward_with_rope(q, k, v, batch, rope)
        q, k = q_rot, k_rot
    else:
        layer(q, k, v, batch)
    assert not impl.kv_scales_pending
    assert impl.k_scale == pytest.approx(k.abs().max().item() / K_SCALE_CONSTANT)
    assert impl.v_scale == pytest.approx(v.abs().max().item() / V_SCALE_CONSTANT)
    assert impl.q_scale == pytest.approx(q.abs().max().item() / Q_SCALE_CONSTANT)
    # the step's keys went into the cache with those scales
    stored = batch.kv_caches[0][0, 0, :5].float() * impl.k_scale
    assert (stored - k).abs().max().item() <= 0.07 * k.abs().max().item()


def test_kv_scales_record_takes_the_largest_value():
    scales = KVScales()
    assert scales.add("model.layers.0.self_attn.kv_scale", torch.tensor([0.5, -3.0]))
    assert not scales.add("model.layers.0.self_attn.q_proj.weight", torch.ones(2))
    assert scales.layer(0) == (3.0, 3.0, None) and scales.layer(1) == (1.0, 1.0, None)
    assert scales.source == "checkpoint"


def test_gpu_memory_utilization_on_cpu_is_warned_about_once(caplog):
    from attnserve.config.cache import CacheConfig
    from attnserve.model_executor.kv_cache import num_kv_blocks

    cache = CacheConfig(gpu_memory_utilization=0.37, kv_cache_memory=1 << 20)
    with caplog.at_level(logging.WARNING, logger="attnserve.model_executor.kv_cache"):
        for _ in range(2):
            assert num_kv_blocks(cache, torch.device("cpu"), 4096, 0) == 256
        num_kv_blocks(CacheConfig(kv_cache_memory=1 << 20), torch.device("cpu"), 4096, 0)  # the default: silent
    warned = [r.getMessage() for r in caplog.records if "gpu_memory_utilization" in r.getMessage()]
    assert warned == [
        "gpu_memory_utilization 0.37 has no effect on CPU: kv_cache_memory sizes the KV cache there (default 2 GiB)"
    ]


def test_kv_scales_from_lazily_read_shards(tmp_path):
    """Tensor-parallel ranks read tensors lazily: a 0-d scale and a per-head one are read whole."""
    from safetensors.torch import save_file

    from attnserve.model_executor.kv_scales import split_kv_scales
    from attnserve.model_executor.weights import safetensors_weights

    save_file(
        {
            "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
            "model.layers.0.self_attn.v_scale": torch.tensor([2.0, 4.0]),
            "model.norm.weight": torch.ones(2),
        },
        str(tmp_path / "model.safetensors"),
    )
    scales = KVScales()
    rest = [name for name, _ in split_kv_scales(safetensors_weights(str(tmp_path), lazy=True), scales)]
    assert rest == ["model.norm.weight"] and scales.layer(0) == (0.5, 4.0, None)


def test_fp8_cache_with_layer_groups_and_per_layer_scales(tiny_model_dir, tmp_path):
    """Gemma 2 (windowed and global layer groups, soft caps): every group's builder plans the fp8 cache, each
    layer of each group gets its own checkpoint scales, and the fp8 logits stay near the 16-bit ones."""
    from safetensors.torch import save_file

    from attnserve import LLM, SamplingParams
    from attnserve.core.step import ScheduledRequest, SchedulerOutput
    from attnserve.model_executor.grouped_builder import GroupedMetadataBuilder

    folder = tmp_path / "gemma2_fp8_scales"
    shutil.copytree(tiny_model_dir("gemma2"), folder)
    want = [(0.5, 0.25), (0.125, 2.0), (1.5, 0.75), (0.0625, 0.5)]
    save_file(
        {
            f"model.layers.{i}.self_attn.{n}_scale": torch.tensor(s)
            for i, ks in enumerate(want)
            for n, s in zip("kv", ks)
        },
        str(folder / "kv_scales.safetensors"),
    )

    def run(kv):
        llm = LLM(str(folder), dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20, kv_cache_dtype=kv)
        reqs = [ScheduledRequest("a", list(range(100, 130)), 0, list(range(8)), SamplingParams(temperature=0), True)]
        return llm, llm.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0]

    llm, fp8 = run("fp8")
    runner = llm.engine.runner
    assert [g.layers for g in runner.attention.groups] == [(0, 2), (1, 3)]
    assert isinstance(runner.builder, GroupedMetadataBuilder)
    assert [b.layer_spec.kv_cache_dtype for b in runner.builders] == ["fp8", "fp8"]
    assert all(c.dtype == torch.float8_e4m3fn for c in runner.kv_caches)
    assert _scales(llm) == want
    _, ref = run("auto")
    assert 0 < (fp8 - ref).abs().max().item() < 0.1 * ref.abs().max().item()


def test_fp8_cache_with_attention_sinks_and_calculated_scales(tiny_model_dir):
    """gpt-oss (sinks, windowed and full layer groups): calculated scales reach every layer of every group."""
    from attnserve import LLM, SamplingParams

    llm = LLM(
        tiny_model_dir("gpt_oss_mixed"),
        dtype="float32",
        device="cpu",
        block_size=4,
        kv_cache_memory=8 << 20,
        kv_cache_dtype="fp8_e5m2",
        calculate_kv_scales=True,
    )
    runner = llm.engine.runner
    assert len(runner.attention.groups) == 2 and all(g.kind.has_sink for g in runner.attention.groups)
    out = llm.generate([list(range(100, 120))], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
    assert not any(i.kv_scales_pending for i in runner.attn_impls.values())
    assert len(runner.attn_impls) == runner.num_layers
    assert all(k != 1.0 and v != 1.0 for k, v in _scales(llm))
