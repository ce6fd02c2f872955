"""Which FlashInfer JIT modules a model's layer groups need (``flashinfer_modules``), without FlashInfer: the
arguments FlashInfer 0.7.2's plan() passes to get_batch_decode_module / get_batch_prefill_module; and when the
compile-ahead start (``flashinfer_jit.start``) steps aside."""

from __future__ import annotations

import logging

import torch

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.attention.backends import flashinfer_jit as fj
from attnserve.attention.backends import flashinfer_modules as fm
from attnserve.config import AttentionConfig

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def sm90(q: torch.dtype, kv: torch.dtype, head_dim: int) -> str:
    """FlashInfer's determine_attention_backend on an H200 (utils.py: is_fa3_backend_supported and
    is_fa3_prefill_head_dim_supported): fa3 unless an fp8 cache meets a 16-bit query, or the head dim is odd."""
    if kv in FP8 and q not in FP8:
        return "fa2"
    return "fa3" if head_dim in (64, 128, 256) else "fa2"


def sm80(q: torch.dtype, kv: torch.dtype, head_dim: int) -> str:
    return "fa2"


def spec(hq=32, hkv=8, d=128, window=None, cap=None, kv="auto") -> AttentionLayerSpec:
    return AttentionLayerSpec(hq, d, d**-0.5, hkv, sliding_window=window, logits_soft_cap=cap, kv_cache_dtype=kv)


def modules(specs, resolve=sm90, cfg=None, dtype=BF16) -> list[fm.KernelModule]:
    fp8_query = resolve is sm90  # FlashInfer's sm90 prefill takes an fp8 query (fm.takes_fp8_query)
    return fm.kernel_modules([fm.plan_settings(s, dtype, cfg, fp8_query) for s in specs], resolve)


def M(getter, backend, q, kv, d=128, window=False, cap=False, o=BF16) -> fm.KernelModule:
    return fm.KernelModule(getter, backend, q, kv, o, d, window, cap)


def test_gqa_bf16_tensor_core_decode_is_fa2_and_prefill_fa3_on_sm90():
    assert modules([spec()]) == [M("prefill", "fa2", BF16, BF16), M("prefill", "fa3", BF16, BF16)]
    # on sm80 both wrappers load the same fa2 module: listed once
    assert modules([spec()], sm80) == [M("prefill", "fa2", BF16, BF16)]


def test_gqa_args_are_the_getters_positional_arguments():
    decode, prefill = modules([spec()])
    assert decode.args() == (BF16, BF16, BF16, torch.int32, 128, 128, 0, False, False, False)
    assert prefill.backend == "fa3" and prefill.args() == decode.args()


def test_mha_bf16_uses_the_cuda_core_decode_module():
    decode, prefill = modules([spec(hq=9, hkv=9, d=64)])
    assert decode == M("decode", None, BF16, BF16, d=64)
    assert decode.args() == (BF16, BF16, BF16, torch.int32, 64, 64, 0, False, False)  # no fp16_qk_reduction
    assert prefill == M("prefill", "fa3", BF16, BF16, d=64)


def test_fp8_kv_decodes_a_16_bit_query_and_quantizes_the_sm90_prefill_query():
    settings = fm.plan_settings(spec(kv="fp8"), BF16, None, True)
    assert (settings.decode_q_dtype, settings.prefill_q_dtype, settings.decode_backend) == (BF16, E4M3, "fa2")
    assert modules([spec(kv="fp8")]) == [M("prefill", "fa2", BF16, E4M3), M("prefill", "fa3", E4M3, E4M3)]
    # MHA: the CUDA-core decode of the 16-bit query
    assert modules([spec(hq=9, hkv=9, kv="fp8")])[0] == M("decode", None, BF16, E4M3)
    e5m2 = torch.float8_e5m2
    assert modules([spec(kv="fp8_e5m2")]) == [M("prefill", "fa2", BF16, e5m2), M("prefill", "fa3", e5m2, e5m2)]


def test_fp8_kv_query_stays_16_bit_where_the_prefill_kernel_refuses_fp8():
    # sm80: FlashInfer's fa2 prefill refuses an fp8 query, so neither wrapper gets one; both load one module
    assert fm.plan_settings(spec(kv="fp8"), BF16, None, False).prefill_q_dtype == BF16
    assert modules([spec(kv="fp8")], sm80) == [M("prefill", "fa2", BF16, E4M3)]


def test_fp8_kv_without_query_quantization():
    keep = AttentionConfig(disable_flashinfer_q_quantization=True)
    # GQA: both wrappers' fa2 module (sm90's fa3 wants an fp8 query); MHA: the CUDA-core decode
    assert modules([spec(kv="fp8")], cfg=keep) == [M("prefill", "fa2", BF16, E4M3)]
    mha = modules([spec(hq=8, hkv=8, kv="fp8")], cfg=keep)
    assert mha == [M("decode", None, BF16, E4M3), M("prefill", "fa2", BF16, E4M3)]


def test_sliding_window_and_soft_cap_set_their_flags():
    s = spec(hq=8, hkv=4, d=256, window=4096, cap=50.0)
    assert fm.plan_settings(s, BF16, None, True).window_left == 4095
    assert modules([s]) == [
        M("prefill", "fa2", BF16, BF16, d=256, window=True, cap=True),
        M("prefill", "fa3", BF16, BF16, d=256, window=True, cap=True),
    ]
    mha = modules([spec(hq=4, hkv=4, d=64, window=16, cap=30.0)], sm80)
    assert mha[0] == M("decode", None, BF16, BF16, d=64, window=True, cap=True)


def test_layer_groups_with_different_head_sizes_are_deduplicated():
    # Gemma-style: windowed and global layers; a third group equal to the first adds nothing
    groups = [spec(d=128, window=1024), spec(d=256), spec(d=128, window=1024)]
    assert modules(groups) == [
        M("prefill", "fa2", BF16, BF16, d=128, window=True),
        M("prefill", "fa3", BF16, BF16, d=128, window=True),
        M("prefill", "fa2", BF16, BF16, d=256),
        M("prefill", "fa3", BF16, BF16, d=256),
    ]
    assert len(modules(groups, sm80)) == 2


def test_disable_flashinfer_prefill_plans_no_prefill_module():
    cfg = AttentionConfig(disable_flashinfer_prefill=True)
    assert modules([spec()], cfg=cfg) == [M("prefill", "fa2", BF16, BF16)]  # the tensor-core decode only
    assert modules([spec(hq=8, hkv=8)], cfg=cfg) == [M("decode", None, BF16, BF16)]


def test_float16_model_outputs_float16():
    (decode, prefill) = modules([spec()], dtype=torch.float16)
    assert decode.o_dtype == prefill.o_dtype == torch.float16


def test_start_without_flashinfer_logs_and_returns_none(monkeypatch, caplog):
    import sys

    monkeypatch.setenv(fj.ON_ENV, "1")
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # an import error, as where it is not installed
    fj._log_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        assert fj.start([spec()], torch.device("cuda"), BF16, None) is None
    assert "not compiled ahead" in caplog.text
    assert fj.start([spec()], torch.device("cpu"), BF16, None) is None  # no GPU: nothing to compile
    fj.wait()  # nothing started: returns at once


def test_start_is_on_unless_switched_off(monkeypatch, caplog):
    monkeypatch.setitem(__import__("sys").modules, "flashinfer", None)
    fj._log_once.cache_clear()
    monkeypatch.setenv(fj.ON_ENV, "0")
    with caplog.at_level(logging.INFO):
        assert fj.start([spec()], torch.device("cuda"), BF16, None) is None
    assert caplog.text == ""  # off: FlashInfer is not even imported
    monkeypatch.delenv(fj.ON_ENV)
    assert fj.compile_ahead_on()  # unset: on (DEFAULT_ON)
    with caplog.at_level(logging.INFO):
        assert fj.start([spec()], torch.device("cuda"), BF16, None) is None  # FlashInfer missing here
    assert "not compiled ahead" in caplog.text and "lazy compile" in caplog.text  # tried: the import failed


def test_another_flashinfer_version_is_skipped(monkeypatch, caplog):
    import sys
    import types

    monkeypatch.setenv(fj.ON_ENV, "1")
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__="0.8.0"))
    fj._log_once.cache_clear()
    with caplog.at_level(logging.INFO):
        assert fj.start([spec()], torch.device("cuda"), BF16, None) is None
    assert "FlashInfer 0.8.0" in caplog.text and "first use" in caplog.text


def first(specs, compiled=frozenset(), resolve=sm90, cfg=None) -> fm.FirstUse:
    fp8_query = resolve is sm90
    settings = [fm.plan_settings(s, BF16, cfg, fp8_query) for s in specs]
    return fm.first_use(settings, resolve, lambda m: m in compiled)


def test_first_use_puts_sm90s_fa3_prefill_behind_the_fa2_one():
    fa2, fa3 = M("prefill", "fa2", BF16, BF16), M("prefill", "fa3", BF16, BF16)
    # GQA: the interim prefill is the tensor-core decode's module: one module before the first step
    assert first([spec()]) == fm.FirstUse([fa2], [fa3])
    assert first([spec()], {fa2}) == fm.FirstUse([], [fa3])
    assert first([spec()], {fa3}) == fm.FirstUse([fa2], [])  # fa3 compiled: no interim
    assert first([spec()], {fa2, fa3}) == fm.FirstUse([], [])
    assert first([spec()], resolve=sm80) == fm.FirstUse([fa2], [])  # fa2 is the prefill: nothing behind it


def test_first_use_mha_waits_for_the_cuda_core_decode_and_the_interim_prefill():
    d = M("decode", None, BF16, BF16, d=64)
    fa2, fa3 = M("prefill", "fa2", BF16, BF16, d=64), M("prefill", "fa3", BF16, BF16, d=64)
    assert first([spec(hq=9, hkv=9, d=64)]) == fm.FirstUse([d, fa2], [fa3])


def test_first_use_fp8_interim_prefill_takes_the_16_bit_query():
    # fa2 refuses an fp8 query: the interim plans the model's, the fa3 prefill the cache's once loaded
    assert first([spec(kv="fp8")]) == fm.FirstUse([M("prefill", "fa2", BF16, E4M3)], [M("prefill", "fa3", E4M3, E4M3)])


def test_first_use_without_a_prefill_wrapper_has_nothing_behind():
    cfg = AttentionConfig(disable_flashinfer_prefill=True)
    assert first([spec()], cfg=cfg) == fm.FirstUse([M("prefill", "fa2", BF16, BF16)], [])


def test_module_names_for_the_log():
    assert M("prefill", "fa3", E4M3, E4M3).name() == "prefill/fa3 (head 128, KV float8_e4m3fn)"
    assert M("decode", None, BF16, BF16, d=64).name() == "decode (head 64, KV bfloat16)"
