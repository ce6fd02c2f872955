"""FLASHINFER's compile-ahead lists what its wrappers load: after ``flashinfer_jit.start`` and ``wait``, the
decode and prefill wrappers' plan() and run() build no module that is not compiled, and none that the warm-up did
not list. Clears no cache (already compiled modules are simply found compiled). Run on the H200:
``pytest tests/gpu/test_flashinfer_compile_ahead_gpu.py -m gpu -s``."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from attnserve.attention.backend import AttentionLayerSpec
from tests.gpu.cases import Case, run_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None, reason="needs CUDA, FlashInfer"
    ),
]

MHA64 = dict(num_heads=8, num_kv_heads=8, head_size=64)  # CUDA-core decode
GEMMA = dict(num_heads=8, num_kv_heads=4, head_size=256, sliding_window=48, logits_soft_cap=50.0)
CASES = [
    Case(shape, **extra)
    for extra in ({}, MHA64, dict(kv_cache_dtype="fp8"), dict(kv_cache_dtype="fp8", **MHA64), GEMMA)
    for shape in ("decode_b64", "mixed")
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_plan_and_run_load_only_modules_compiled_ahead(case, monkeypatch):
    monkeypatch.setenv("ATTNSERVE_FLASHINFER_COMPILE_AHEAD", "1")
    from flashinfer.jit.core import JitSpecNvcc

    from attnserve.attention.backends import flashinfer_jit
    from attnserve.attention.backends.flashinfer import FlashInferBackend

    spec = AttentionLayerSpec(
        case.num_heads,
        case.head_size,
        case.head_size**-0.5,
        case.num_kv_heads,
        case.sliding_window,
        case.logits_soft_cap,
        case.kv_cache_dtype,
    )
    warm = flashinfer_jit.start([spec], torch.device("cuda"), case.dtype, None)
    assert warm is not None, "compile-ahead skipped (see the log)"
    flashinfer_jit.wait()
    for item in flashinfer_jit._LATER.values():  # the fa3 prefill behind the interim: loaded before the check
        item.done.wait()
        assert item.error is None
    assert warm.error is None
    # every module the wrappers load (those compiled before are no longer in warm.modules), and the interim's
    wanted = flashinfer_jit.device_modules([spec], torch.device("cuda"), case.dtype, None) + warm.modules
    listed = {s.name for s in flashinfer_jit.loaded_specs(wanted)}
    built: list[tuple[str, bool]] = []
    original = JitSpecNvcc.build

    def record(self, *args, **kwargs):
        built.append((self.name, self.is_compiled))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JitSpecNvcc, "build", record)
    result = run_case(FlashInferBackend, case, "cuda")
    assert result["pass"], result
    assert not [n for n, ok in built if not ok], f"compiled at first use, not ahead: {built}"
    assert {n for n, _ in built} <= listed, f"loaded but not listed: {built} (listed {sorted(listed)})"
    print(case.name, "listed", sorted(listed), "loaded", [n for n, _ in built])


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_interim_fa2_prefill_matches_the_oracle(kv, monkeypatch):
    """While sm90's prefill module is pending (a ``Later`` never set), prefill and mixed steps run the interim fa2
    wrapper with the model-dtype query, against the float64 oracle."""
    import threading

    from attnserve.attention.backends import flashinfer_jit as fj
    from attnserve.attention.backends import flashinfer_modules as fm
    from attnserve.attention.backends.flashinfer import FlashInferBackend

    for shape in ("prefill", "mixed"):
        case = Case(shape, kv_cache_dtype=kv)
        spec = AttentionLayerSpec(case.num_heads, case.head_size, case.head_size**-0.5, case.num_kv_heads,
                                  kv_cache_dtype=kv)  # fmt: skip
        settings = fm.plan_settings(spec, case.dtype, None, fm.takes_fp8_query(torch.device("cuda")))
        module = fm.prefill_module(settings, fj.device_resolver(torch.device("cuda")))
        assert module.backend == "fa3"
        monkeypatch.setitem(fj._LATER, module, fj.Later(module, threading.Event()))
        result = run_case(FlashInferBackend, case, "cuda")
        assert result["pass"], result


def test_engine_start_compiles_the_runners_modules_ahead(monkeypatch):
    monkeypatch.setenv("ATTNSERVE_FLASHINFER_COMPILE_AHEAD", "1")
    from attnserve import LLM
    from attnserve.attention.backends import flashinfer_jit as fj

    llm = LLM(attention_backend="FLASHINFER", dtype="bfloat16", num_gpu_blocks=512)
    b = llm.engine.runner.builders[0]
    expected = fj.device_modules([b.layer_spec], b.device, b.dtype, b.attention_config)
    for item in fj._LATER.values():
        item.done.wait()
    # a warm-up lists only what was not compiled when it started; after it, every module the runner plans is
    assert fj._WARMUPS, "compile-ahead did not start"
    assert all(s.is_compiled for s in fj.loaded_specs(expected))
