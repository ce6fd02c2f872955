"""FLASHINFER's builder while sm90's fa3 prefill module compiles in the background (``flashinfer_jit.Later``):
prefill steps plan an fa2 wrapper with the model-dtype query, then, once the module is loaded, the prefill wrapper
FlashInfer resolves itself, with the query type of :func:`flashinfer_modules.query_dtypes`. FlashInfer's wrappers are
the recorders of test_attention_config_fields (CPU)."""

from __future__ import annotations

import threading

import pytest
import torch

from attnserve.attention.backend import AttentionLayerSpec, KVCacheLayout
from attnserve.attention.backends import flashinfer_jit as fj
from attnserve.attention.backends import flashinfer_modules as fm
from attnserve.attention.backends.flashinfer import FlashInferMetadataBuilder
from attnserve.benchmarks.attention import make_step
from tests.attention.test_attention_config_fields import recorder  # noqa: F401 - the fixture
from tests.attention.test_flashinfer_jit import sm90


def _spec(kv: str) -> AttentionLayerSpec:
    return AttentionLayerSpec(32, 128, 128**-0.5, 8, kv_cache_dtype=kv)


def _builder(kv: str) -> FlashInferMetadataBuilder:
    return FlashInferMetadataBuilder(_spec(kv), torch.device("cpu"), torch.bfloat16, kv_cache_layout=KVCacheLayout.NHD)


def _prefill_plans(rec, builder) -> list[tuple]:
    """(the planned wrapper's init kwargs, the plan's query type) of one mixed step's prefill call."""
    rec.calls.clear()
    common, _ = make_step([1, 1, 5], [9, 20, 5], 16, torch.Generator().manual_seed(0), torch.device("cpu"))
    (call,) = builder.build(common).calls
    assert call.kind == "prefill"
    inits = {id(w): kw for w, kw in ((builder.prefill, "auto"), (builder.prefill_interim, "fa2")) if w is not None}
    plan = dict(next(c for c in rec.calls if c[0] == "prefill.plan")[2])
    return [inits[id(call.wrapper)], plan["q_data_type"], call.q_dtype]


@pytest.mark.parametrize("kv, own_q", [("auto", torch.bfloat16), ("fp8", torch.float8_e4m3fn)])
def test_prefill_runs_fa2_until_the_fa3_module_is_loaded(recorder, monkeypatch, kv, own_q):  # noqa: F811
    monkeypatch.setattr(fj, "device_resolver", lambda device: sm90)
    settings = fm.plan_settings(_spec(kv), torch.bfloat16, None, True)
    pending = fj.Later(fm.prefill_module(settings, sm90), threading.Event())
    assert pending.module.backend == "fa3"
    monkeypatch.setitem(fj._LATER, pending.module, pending)
    builder = _builder(kv)
    init = [dict(c[2]) for c in recorder.calls if c[0] == "prefill.__init__"]
    assert init == [{}, {"backend": "fa2"}]  # FlashInfer's own choice ("auto"), and the interim
    assert _prefill_plans(recorder, builder) == ["fa2", torch.bfloat16, torch.bfloat16]
    assert _prefill_plans(recorder, builder) == ["fa2", torch.bfloat16, torch.bfloat16]
    pending.done.set()
    assert _prefill_plans(recorder, builder) == ["auto", own_q, own_q]
    assert builder.prefill_interim is None and builder.interim_plans == 2


def test_a_failed_background_compile_keeps_the_interim(recorder, monkeypatch):  # noqa: F811
    monkeypatch.setattr(fj, "device_resolver", lambda device: sm90)
    settings = fm.plan_settings(_spec("auto"), torch.bfloat16, None, True)
    pending = fj.Later(fm.prefill_module(settings, sm90), threading.Event(), error="RuntimeError: nvcc")
    pending.done.set()
    monkeypatch.setitem(fj._LATER, pending.module, pending)
    builder = _builder("auto")
    assert _prefill_plans(recorder, builder) == ["fa2", torch.bfloat16, torch.bfloat16]


def test_no_pending_module_plans_flashinfers_own_prefill(recorder):  # noqa: F811
    builder = _builder("auto")
    assert builder.prefill_interim is None
    assert _prefill_plans(recorder, builder) == ["auto", torch.bfloat16, torch.bfloat16]


def test_an_unresolvable_prefill_backend_plans_the_wrapper_as_it_is(monkeypatch, caplog):
    def broken(device):
        raise ImportError("no flashinfer.utils")

    monkeypatch.setattr(fj, "device_resolver", broken)
    settings = fm.plan_settings(_spec("auto"), torch.bfloat16, None, True)
    module = fm.prefill_module(settings, sm90)
    monkeypatch.setitem(fj._LATER, module, fj.Later(module, threading.Event()))
    fj._log_once.cache_clear()
    assert fj.pending_prefill(settings, torch.device("cpu")) is None
    assert "not resolved (ImportError" in caplog.text


def test_start_builds_now_then_later_and_a_failed_later_keeps_the_interim(recorder, monkeypatch):  # noqa: F811
    import sys

    monkeypatch.setattr(sys.modules["flashinfer"], "__version__", "0.7.2.post1", raising=False)
    monkeypatch.setenv(fj.ON_ENV, "1")
    monkeypatch.setattr(fj, "device_resolver", lambda device: sm90)
    monkeypatch.setattr(fj, "_is_compiled", lambda module: False)
    monkeypatch.setattr(fj, "_WARMUPS", {})
    monkeypatch.setattr(fj, "_LATER", {})
    loaded = []

    def load(module):
        if module.backend == "fa3":
            raise RuntimeError("nvcc failed")
        loaded.append(module)

    monkeypatch.setattr(fj, "load", load)
    warm = fj.start([_spec("auto")], torch.device("cuda"), torch.bfloat16, None)
    warm.thread.join()
    (fa2,), (fa3,) = warm.first.now, warm.first.later
    assert loaded == [fa2] and warm.error is None and warm.now_done.is_set()
    later = fj._LATER[fa3]
    assert later.done.is_set() and later.error == "RuntimeError: nvcc failed" and not later.ready()
    assert _prefill_plans(recorder, _builder("auto")) == ["fa2", torch.bfloat16, torch.bfloat16]
