"""Every AttentionConfig field against every backend: setting it changes what runs (the kernel, its arguments or
the plan), or the combination is refused with a reason naming the field, or (an option of another backend) the
engine warns once that it is unused. No field is accepted and silently ignored.

"What runs" is read from the kernel libraries' calls: the FlashAttention and FlashInfer modules are replaced by
recorders (``sys.modules``) that note every call's name and arguments and return zeros, so the real builders and
Impls run on CPU exactly as far as the kernel launch. TRITON_ATTN's plan (its builder's call list) needs Triton.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from attnserve.attention.backend import KVCacheLayout
from attnserve.attention.registry import AttentionBackendEnum as B
from attnserve.attention.selector import AttentionSelectorConfig
from attnserve.benchmarks.attention import make_step
from attnserve.config.attention import AttentionConfig
from attnserve.platforms import detect_platform

HAS_TRITON = importlib.util.find_spec("triton") is not None
# launching a Triton kernel needs a GPU driver or the interpreter (TRITON_INTERPRET=1); Triton can be installed
# without either (xgrammar brings it onto CPU machines)
TRITON_LAUNCHES = HAS_TRITON and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")

# a value other than the default for each option field (backend: test_backend_field_selects_the_backend)
CHANGED = {
    "flash_attn_version": 4,  # the default resolves to 3 on compute capability 9.0
    "use_prefill_decode_attention": True,
    "flash_attn_max_num_splits_for_cuda_graph": 8,
    "use_trtllm_attention": True,  # false means what unset does: the TRT-LLM kernels are not wired
    "disable_flashinfer_prefill": True,
    "disable_flashinfer_q_quantization": True,
}

CHANGES, REFUSED, UNUSED = "changes what runs", "refused", "warned unused"
EXPECTED = {
    "FLASH_ATTN": {
        "flash_attn_version": CHANGES,
        "use_prefill_decode_attention": CHANGES,
        "flash_attn_max_num_splits_for_cuda_graph": CHANGES,
        "use_trtllm_attention": UNUSED,
        "disable_flashinfer_prefill": UNUSED,
        "disable_flashinfer_q_quantization": UNUSED,
    },
    "FLASHINFER": {
        "flash_attn_version": UNUSED,
        "use_prefill_decode_attention": CHANGES,
        "flash_attn_max_num_splits_for_cuda_graph": UNUSED,
        "use_trtllm_attention": REFUSED,
        "disable_flashinfer_prefill": CHANGES,
        "disable_flashinfer_q_quantization": CHANGES,
    },
    "TRITON_ATTN": {
        "flash_attn_version": UNUSED,
        "use_prefill_decode_attention": REFUSED,
        "flash_attn_max_num_splits_for_cuda_graph": UNUSED,
        "use_trtllm_attention": UNUSED,
        "disable_flashinfer_prefill": UNUSED,
        "disable_flashinfer_q_quantization": UNUSED,
    },
    "FLEX_ATTENTION": {
        "flash_attn_version": UNUSED,
        "use_prefill_decode_attention": CHANGES,
        "flash_attn_max_num_splits_for_cuda_graph": UNUSED,
        "use_trtllm_attention": UNUSED,
        "disable_flashinfer_prefill": UNUSED,
        "disable_flashinfer_q_quantization": UNUSED,
    },
    "CPU_ATTN": {
        "flash_attn_version": UNUSED,
        "use_prefill_decode_attention": REFUSED,
        "flash_attn_max_num_splits_for_cuda_graph": UNUSED,
        "use_trtllm_attention": UNUSED,
        "disable_flashinfer_prefill": UNUSED,
        "disable_flashinfer_q_quantization": UNUSED,
    },
}
# the cache each backend is judged with: fp8 where it reads one (disable_flashinfer_q_quantization is about fp8);
# FLASH_ATTN 16-bit, so that flash_attn_version 4 (no fp8) is judged on its own (fp8 runs: the tests further down)
KV = {"FLASH_ATTN": "auto", "FLASHINFER": "fp8", "TRITON_ATTN": "fp8", "FLEX_ATTENTION": "auto", "CPU_ATTN": "fp8"}


def test_the_walk_covers_every_field():
    assert set(CHANGED) | {"backend"} == set(AttentionConfig.field_names())
    assert all(set(row) == set(CHANGED) for row in EXPECTED.values())


# ---------------------------------------------------------------- recorders in place of the kernel libraries


def _arg(x):
    """A call argument as plain data: tensors by shape and dtype, numbers and text as they are."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), str(x.dtype))
    if isinstance(x, (tuple, list)):
        return tuple(_arg(v) for v in x)
    return x


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def note(self, name: str, args: tuple, kwargs: dict) -> None:
        self.calls.append((name, tuple(_arg(a) for a in args), tuple(sorted((k, _arg(v)) for k, v in kwargs.items()))))


def _flash_attn_modules(rec: Recorder) -> dict[str, types.ModuleType]:
    def fn(name):
        def call(*args, **kwargs):
            rec.note(name, args, kwargs)
            if name.endswith("get_scheduler_metadata"):
                return torch.zeros(4, dtype=torch.int32)
            return torch.zeros(args[0].shape, dtype=torch.bfloat16)

        return call

    mods = {}
    for mod_name in ("flash_attn_interface", "flash_attn", "flash_attn.cute"):
        m = types.ModuleType(mod_name)
        for f in ("get_scheduler_metadata", "flash_attn_with_kvcache", "flash_attn_varlen_func"):
            setattr(m, f, fn(f"{mod_name}.{f}"))
        mods[mod_name] = m
    mods["flash_attn"].cute = mods["flash_attn.cute"]
    return mods


def _flashinfer_module(rec: Recorder) -> types.ModuleType:
    def wrapper(kind):
        class Wrapper:
            def __init__(self, workspace, layout, **kwargs):
                rec.note(f"{kind}.__init__", (layout,), kwargs)
                self._int_workspace_buffer = torch.zeros(8, dtype=torch.uint8)

            def plan(self, *args, **kwargs):
                rec.note(f"{kind}.plan", args[3:], kwargs)  # heads, head size, page size on: the page arrays vary

            def run(self, q, kv_cache, out=None, **kwargs):
                rec.note(f"{kind}.run", (q,), kwargs)

        return Wrapper

    m = types.ModuleType("flashinfer")
    m.BatchDecodeWithPagedKVCacheWrapper = wrapper("decode")
    m.BatchPrefillWithPagedKVCacheWrapper = wrapper("prefill")
    return m


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    for name, mod in {**_flash_attn_modules(rec), "flashinfer": _flashinfer_module(rec)}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    # FlashInfer's builder reads the SM count and compute capability at construction (an H200's)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(multi_processor_count=132, major=9)
    )
    return rec


def _spec(kv: str):
    from attnserve.attention.backend import AttentionLayerSpec

    return AttentionLayerSpec(num_heads=32, head_size=128, scale=128**-0.5, num_kv_heads=8, kv_cache_dtype=kv)


def run_plan(backend: str, cfg: AttentionConfig, rec: Recorder, kv: str | None = None) -> list:
    """What one mixed step (2 decodes, 1 prefill) and one CUDA-graph decode capture run for ``backend`` with
    ``cfg``: the kernel libraries' calls, or the builder's plan where the kernels are our own."""
    from attnserve.attention.kv_cache_dtype import kv_cache_torch_dtype
    from attnserve.model_executor.kv_cache import allocate_kv_caches

    backend_cls = B[backend].get_class()
    kv = kv or KV[backend]
    spec, dev = _spec(kv), torch.device("cpu")
    if backend == "FLASH_ATTN" and cfg.flash_attn_version is None:
        cfg = dataclasses.replace(cfg, flash_attn_version=3)  # what the selector resolves on 9.0 (ModelRunner's rule)
    gen = torch.Generator().manual_seed(0)
    common, num_blocks = make_step([1, 1, 5], [9, 20, 5], 16, gen, dev)
    rec.calls.clear()
    builder = backend_cls.get_builder_cls()(
        spec, dev, torch.bfloat16, attention_config=cfg, kv_cache_layout=KVCacheLayout.NHD
    )
    metadata = builder.build(common)
    if backend in ("TRITON_ATTN", "FLEX_ATTENTION"):  # our kernels: the plan is the call list
        return [
            (c.token_range, c.num_splits) if backend == "TRITON_ATTN" else (c.query_start, c.query_end)
            for c in metadata.calls
        ]
    kinds = [c.kind for c in metadata.calls] if backend == "FLASHINFER" else []
    if "fallback" in kinds and not TRITON_LAUNCHES:  # the plan says what would run; nothing here can launch it
        return list(rec.calls) + kinds
    impl = backend_cls.get_impl_cls()(spec, attention_config=cfg)
    (cache,) = allocate_kv_caches(
        backend_cls, KVCacheLayout.NHD, 1, num_blocks, 16, 8, 128, kv_cache_torch_dtype(kv, torch.bfloat16), dev
    )
    q, k, v = (torch.randn(7, h, 128, dtype=torch.bfloat16) for h in (32, 8, 8))
    impl.forward(q, k, v, cache, metadata)
    if backend == "FLASH_ATTN":  # the decode graph's split plan (made inside the graph by the prologue)
        decode, _ = make_step([1, 1], [9, 20], 16, gen, dev)
        builder.cudagraph_prologue(builder.build_for_cudagraph_capture(decode))
    return list(rec.calls) + kinds


def outcome(backend: str, field: str, rec: Recorder) -> str:
    cfg = AttentionConfig(**{field: CHANGED[field]})
    explicit = dataclasses.replace(cfg, backend=B[backend])
    if field in explicit.unused_options():
        return UNUSED
    platform = detect_platform("cpu" if backend == "CPU_ATTN" else "cuda:9.0")
    selector = AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16, kv_cache_dtype=KV[backend])
    reasons = B[backend].get_class().validate(selector, platform, cfg, assume_installed=True)
    assert not B[backend].get_class().validate(selector, platform, AttentionConfig(), assume_installed=True)
    if any(r.field == field for r in reasons):
        return REFUSED
    assert not reasons, reasons
    if backend == "TRITON_ATTN" and not HAS_TRITON:
        pytest.skip("TRITON_ATTN's builder imports its Triton kernels")
    if field == "disable_flashinfer_prefill" and not HAS_TRITON:
        pytest.skip("FLASHINFER's fallback prefill plan imports the Triton kernel")
    before, after = run_plan(backend, AttentionConfig(), rec), run_plan(backend, cfg, rec)
    assert before, "nothing ran"
    return CHANGES if before != after else "ignored"


@pytest.mark.parametrize("field", list(CHANGED))
@pytest.mark.parametrize("backend", list(EXPECTED))
def test_field_changes_what_runs_or_is_refused(backend, field, recorder):
    assert outcome(backend, field, recorder) == EXPECTED[backend][field]


# ---------------------------------------------------------------- what each change is, in the kernels' arguments


def _kwargs(call) -> dict:
    return dict(call[2])


def test_fa3_graph_splits_follow_the_field(recorder):
    for splits in (32, 8, 256):
        calls = run_plan(
            "FLASH_ATTN", AttentionConfig(flash_attn_max_num_splits_for_cuda_graph=splits), recorder, kv="fp8"
        )
        plan = [c for c in calls if c[0] == "flash_attn_interface.get_scheduler_metadata"]
        assert _kwargs(plan[-1])["num_splits"] == splits  # the graph's plan (the eager step plans with 0)
        assert _kwargs(plan[0])["num_splits"] == 0
        assert all(_kwargs(c)["qkv_dtype"] == torch.float8_e4m3fn for c in plan)  # planned for the fp8 cache


def test_fa3_fp8_passes_descales(recorder):
    (call,) = [
        c
        for c in run_plan("FLASH_ATTN", AttentionConfig(), recorder, kv="fp8")
        if c[0] == "flash_attn_interface.flash_attn_with_kvcache"
    ]
    kw = _kwargs(call)
    assert call[1][0][2] == "torch.float8_e4m3fn"  # the query, quantized
    for name in ("q_descale", "k_descale", "v_descale"):
        assert kw[name] == ("tensor", (3, 8), "torch.float32")  # (requests, KV heads)


def test_flashinfer_fp8_plans_and_runs(recorder):
    calls = run_plan("FLASHINFER", AttentionConfig(use_prefill_decode_attention=True), recorder)
    plans = {c[0]: _kwargs(c) for c in calls if c[0].endswith(".plan")}
    runs = {c[0]: c for c in calls if c[0].endswith(".run")}
    # on 9.0 the prefill's query is quantized, the decode's stays 16-bit (flashinfer_modules.query_dtypes)
    for kind, q in (("decode", torch.bfloat16), ("prefill", torch.float8_e4m3fn)):
        assert plans[f"{kind}.plan"]["kv_data_type"] == torch.float8_e4m3fn
        assert plans[f"{kind}.plan"]["q_data_type"] == q
        assert plans[f"{kind}.plan"]["o_data_type"] == torch.bfloat16
        assert runs[f"{kind}.run"][1][0][2] == str(q)
        assert {"k_scale", "v_scale"} <= set(_kwargs(runs[f"{kind}.run"]))
        assert ("q_scale" in _kwargs(runs[f"{kind}.run"])) == (kind == "prefill")
    inits = {c[0]: _kwargs(c) for c in calls if c[0].endswith(".__init__")}
    assert inits["decode.__init__"]["use_tensor_cores"] is True
    calls = run_plan(
        "FLASHINFER",
        AttentionConfig(use_prefill_decode_attention=True, disable_flashinfer_q_quantization=True),
        recorder,
    )
    for c in calls:
        if c[0].endswith(".plan"):
            assert _kwargs(c)["q_data_type"] == torch.bfloat16 and _kwargs(c)["kv_data_type"] == torch.float8_e4m3fn
        if c[0].endswith(".run"):
            assert c[1][0][2] == "torch.bfloat16" and "q_scale" not in _kwargs(c)


def test_backend_field_selects_the_backend():
    from attnserve.attention.selector import select_attn_backend

    selector = AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16)
    for name in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"):
        assert (
            select_attn_backend(
                AttentionConfig(backend=name), selector, detect_platform("cuda:9.0"), assume_installed=True
            ).name
            == name
        )
    assert (
        select_attn_backend(
            AttentionConfig(backend="CPU_ATTN"),
            dataclasses.replace(selector, dtype=torch.float32),
            detect_platform("cpu"),
        ).name
        == "CPU_ATTN"
    )


@pytest.mark.parametrize("version, cc", [(2, "8.0"), (4, "10.0")])
def test_graph_splits_refused_without_fa3(version, cc):
    cfg = AttentionConfig(flash_attn_version=version, flash_attn_max_num_splits_for_cuda_graph=8)
    selector = AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16, block_size=256)
    reasons = B.FLASH_ATTN.get_class().validate(selector, detect_platform(f"cuda:{cc}"), cfg, assume_installed=True)
    assert [str(r) for r in reasons] == [
        f"flash_attn_max_num_splits_for_cuda_graph 8 not supported with "
        f"flash_attn_version {version} (FlashAttention 3's split plan only)"
    ]


def test_q_quantization_switch_with_a_16_bit_cache_is_warned_about(recorder, caplog):
    from attnserve.attention.backends import flashinfer

    flashinfer._warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="attnserve.attention.backends.flashinfer"):
        for _ in range(2):
            run_plan("FLASHINFER", AttentionConfig(disable_flashinfer_q_quantization=True), recorder, kv="auto")
    assert [r.getMessage() for r in caplog.records] == [
        "disable_flashinfer_q_quantization has no effect with a 16-bit KV cache (kv_cache_dtype auto): the query is "
        "quantized only for an fp8 cache"
    ]


def test_options_of_another_backend_are_warned_about_after_automatic_selection(caplog):
    """Left to automatic selection, a FlashInfer option on a machine where another backend wins is not silent."""
    from transformers import LlamaConfig

    from attnserve.config.engine_args import build_engine_config, log_unused_options_once
    from attnserve.model_executor.attention_selection import select_model_attention

    log_unused_options_once.cache_clear()
    hf = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        intermediate_size=128,
        vocab_size=100,
    )
    hf.architectures = ["LlamaForCausalLM"]
    config = build_engine_config(
        device="cpu", attention_config={"use_trtllm_attention": True, "disable_flashinfer_prefill": True}
    )
    with caplog.at_level("WARNING", logger="attnserve.config.engine_args"):
        for _ in range(2):
            assert select_model_attention(config, hf, 1).backend_names == ("CPU_ATTN",)
    assert [r.getMessage() for r in caplog.records] == [
        "attention_config options use_trtllm_attention, disable_flashinfer_prefill do not apply to attention backend "
        "CPU_ATTN and are unused"
    ]


def test_q_quantization_switch_where_no_kernel_takes_an_fp8_query_is_warned_about(recorder, monkeypatch, caplog):
    from attnserve.attention.backends import flashinfer

    # an A100 (8.0): FlashInfer's fa2 prefill refuses an fp8 query, so the query is never quantized there
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(multi_processor_count=108, major=8)
    )
    flashinfer._warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="attnserve.attention.backends.flashinfer"):
        default = run_plan("FLASHINFER", AttentionConfig(), recorder)
        assert not caplog.records
        kept = run_plan("FLASHINFER", AttentionConfig(disable_flashinfer_q_quantization=True), recorder)
    assert default == kept
    assert all(_kwargs(c)["q_data_type"] == torch.bfloat16 for c in default if c[0].endswith(".plan"))
    assert len(caplog.records) == 1 and "no effect on this GPU" in caplog.records[0].getMessage()
