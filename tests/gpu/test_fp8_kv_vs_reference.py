"""Every installed fp8-capable GPU backend with an fp8 KV cache against a float64 oracle that reads the same fp8
cache (dequantized with the same scales) and, where the kernel quantized the query, the same fp8 query.

Cases: decode (64 requests, context 1 to 8k; one request at 8k), prefill, mixed, GQA 32/8 with head 128, block
sizes 16/32/64, e4m3 and (where the backend takes it) e5m2. Tolerance: max |out - oracle| / max |oracle| <=
``TOLERANCE["fp8"]`` (8e-2: the kernels keep the softmax's probabilities in 16-bit or fp8 before the PV product);
the step's K/V read back within the format's rounding (``KV_WRITE_TOLERANCE``). TRITON_ATTN's other fp8 paths
(``FP8_DOT_MODES``, chosen by ``paged_attention(fp8_dot=)``) against the same oracle. Run on the H200:
``pytest tests/gpu/test_fp8_kv_vs_reference.py -m gpu -s`` (``ATTNSERVE_GPU_BACKENDS`` narrows the labels).
"""

from __future__ import annotations

import importlib.util
import os
import traceback

import pytest
import torch

from attnserve.config.attention import AttentionConfig
from tests.gpu.cases import TOLERANCE, Case, run_case
from tests.gpu.conftest import RESULTS, save_results

pytestmark = pytest.mark.gpu

SHAPES = ("decode_b64", "decode_b1_ctx8k", "prefill", "mixed")
BLOCK_SIZES = (16, 32, 64)


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def fp8_targets() -> list[tuple[str, str, AttentionConfig, tuple[str, ...]]]:
    """(label, backend, attention config, fp8 cache dtypes) of each installed backend that takes an fp8 cache."""
    targets = []
    if _has("triton"):
        targets.append(("TRITON_ATTN", "TRITON_ATTN", AttentionConfig(), ("fp8", "fp8_e5m2")))
        from attnserve.kernels import gluon_fp8_decode

        if gluon_fp8_decode.available():  # its decode calls through the Gluon kernel (ATTNSERVE_GLUON_FP8_DECODE=1)
            targets.append(("TRITON_ATTN/gluon", "TRITON_ATTN", AttentionConfig(), ("fp8", "fp8_e5m2")))
    if _has("flash_attn_interface"):
        targets.append(("FLASH_ATTN/3", "FLASH_ATTN", AttentionConfig(flash_attn_version=3), ("fp8",)))
    if _has("flashinfer"):
        targets.append(("FLASHINFER", "FLASHINFER", AttentionConfig(), ("fp8", "fp8_e5m2")))
        targets.append(
            ("FLASHINFER/no-q-quant", "FLASHINFER", AttentionConfig(disable_flashinfer_q_quantization=True), ("fp8",))
        )
    wanted = os.environ.get("ATTNSERVE_GPU_BACKENDS")
    if wanted:
        keep = {w.strip() for w in wanted.split(",")}
        targets = [t for t in targets if t[0] in keep]
    return targets


PARAMS = [
    pytest.param(
        label,
        name,
        cfg,
        Case(
            shape, num_heads=32, num_kv_heads=8, head_size=128, block_size=bs, dtype=torch.bfloat16, kv_cache_dtype=kv
        ),
        id=f"{label}-{shape}-bs{bs}-{kv}",
    )
    for label, name, cfg, kvs in (fp8_targets() if torch.cuda.is_available() else [])
    for kv in kvs
    for bs in BLOCK_SIZES
    for shape in SHAPES
]


@pytest.mark.parametrize("label,backend_name,attention_config,case", PARAMS)
def test_fp8_backend_matches_float64_oracle(label, backend_name, attention_config, case, monkeypatch):
    from attnserve.attention.registry import AttentionBackendEnum
    from attnserve.kernels import gluon_fp8_decode

    monkeypatch.setenv(gluon_fp8_decode.ON_ENV, "1" if label.endswith("/gluon") else "0")

    backend_cls = AttentionBackendEnum[backend_name].get_class()
    row = {"backend": label, "version": "-", "case": case.name}
    try:
        row.update(run_case(backend_cls, case, "cuda", attention_config, oracle=torch.float64))
    except Exception as e:  # recorded in the table, then re-raised
        row.update({"pass": False, "error": f"{type(e).__name__}: {e}".replace("\n", " ")})
        RESULTS.append(row)
        save_results()
        print(label, case.name, "ERROR", traceback.format_exc()[-1500:], flush=True)
        raise
    RESULTS.append(row)
    save_results()
    print(
        f"{label} {case.name} rel_err={row['rel_err']:.2e} kv_write_err={row['kv_write_err']:.2e} pass={row['pass']}",
        flush=True,
    )
    assert not row["nan"], "NaN in the output"
    assert row["pass"], row


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
def test_fp8_write_saturates_on_the_gpu(kv):
    """The Triton KV write (every GPU backend's) stores out-of-range values as +-max, never inf or nan."""
    if not _has("triton"):
        pytest.skip("no Triton")
    from attnserve.attention.kv_cache_dtype import kv_cache_torch_dtype
    from attnserve.kernels.kv_write import write_kv

    dtype = kv_cache_torch_dtype(kv, torch.bfloat16)
    cache = torch.zeros(2, 4, 16, 2, 128, dtype=dtype, device="cuda")
    key = torch.full((3, 2, 128), 1e30, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    key[1] = -key[1]
    key[2] = float("inf")
    write_kv(key, -key, cache[0], cache[1], torch.tensor([0, 17, 33], device="cuda"), 0.5, 2.0)
    stored = cache.float()
    assert torch.isfinite(stored).all()
    fmax = torch.finfo(dtype).max
    assert stored[0].abs().max().item() == fmax and stored[1].abs().max().item() == fmax


def _mode_cases() -> list:
    """TRITON_ATTN's fp8 paths (``FP8_DOT_MODES``: the engine runs ``default_fp8_dot``'s, the others are the
    benchmark's alternatives), e4m3 and e5m2: decode with splits and mixed batches, GQA 32/8, head 128."""
    from attnserve.kernels.attention_tiles import FP8_DOT_MODES
    from tests.kernels.test_triton_attention_vs_reference import DECODE, MIXED, _op

    cases = []
    for mode in FP8_DOT_MODES:
        for kv in (True, "e5m2"):
            fmt = "e5m2" if kv == "e5m2" else "e4m3"
            for name, reqs, splits, page in (("decode", DECODE, 4, 16), ("mixed", MIXED, 1, 32)):
                case = _op(reqs, page, 4, "bfloat16", splits, head=128, num_kv_heads=8, kv_fp8=kv, fp8_dot=mode)
                cases.append(pytest.param(case, id=f"{mode}-{fmt}-{name}-bs{page}"))
    return cases


@pytest.mark.parametrize("fields", _mode_cases() if torch.cuda.is_available() and _has("triton") else [])
def test_triton_fp8_dot_modes_match_float64_oracle(fields):
    """Each way TRITON_ATTN feeds fp8 tiles to its dots (PTX conversions included, which the interpreter
    replaces) against the float64 oracle over the same dequantized cache."""
    from tests.kernels.triton_attention_interpreted import run_op_case

    res = run_op_case(fields, device="cuda", oracle=torch.float64)
    out, ref = res["out"].double(), res["ref"]
    assert not torch.isnan(out).any()
    rel = (out - ref).abs().max().item() / ref.abs().max().item()
    print(f"TRITON_ATTN fp8_dot={fields['fp8_dot']} kv={fields['kv_fp8']} rel_err={rel:.2e}", flush=True)
    assert rel <= TOLERANCE["fp8"], rel
