"""Selection on simulated platforms: design §7, the CC x head x dtype x block x KV-dtype matrix, reasons."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnserve.attention.backend import KVCacheLayout
from attnserve.attention.registry import AttentionBackendEnum as B
from attnserve.attention.registry import UnknownBackendError, lookup_backend
from attnserve.attention.selector import NoUsableBackendError, evaluate_backends, get_attn_backend, select_attn_backend
from attnserve.attention.validation import package_installed
from attnserve.config.attention import AttentionConfig, ConfigError
from attnserve.platforms import detect_platform
from tests.attention.conftest import cfg, cuda

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def auto(platform, config, **kw):
    return select_attn_backend(None, config, platform, assume_installed=True, **kw).name


# ---------------------------------------------------------------- design §7 reference cases


@pytest.mark.parametrize(
    "cc, expected",
    [
        ("9.0", "TRITON_ATTN"),
        ("8.0", "FLASHINFER"),
        ("10.0", "FLASHINFER"),
        ("7.5", "FLASHINFER"),
        ("7.0", "TRITON_ATTN"),
    ],
)
def test_reference_cases_by_gpu(cc, expected):
    assert auto(cuda(cc), cfg(128, BF16, block_size=16)) == expected


@pytest.mark.parametrize("cc", ["8.0", "9.0", "10.0", "12.0"])
def test_float32_on_cuda_goes_to_triton(cc):
    assert auto(cuda(cc), cfg(128, F32)) == "TRITON_ATTN"


def test_cpu_goes_to_cpu_attn(cpu_attn_backend):
    assert auto(detect_platform("cpu"), cfg(128, BF16)) == "CPU_ATTN"


def test_explicit_flashinfer_head_80_names_size_and_supported_sizes():
    with pytest.raises(NoUsableBackendError) as e:
        get_attn_backend(B.FLASHINFER, cfg(80), cuda("9.0"), assume_installed=True)
    msg = str(e.value)
    assert "head_size 80 not supported (supported: 64, 128, 256)" in msg
    assert "compute capability 9.0" in msg
    assert "Backends that would work: TRITON_ATTN, FLASH_ATTN, FLEX_ATTENTION." in msg


@pytest.mark.parametrize("cc, version", [("8.0", 2), ("9.0", 3), ("10.0", 4)])
def test_explicit_flash_attn_block_8_names_the_block_rule(cc, version):
    rule = "multiples of 256" if version == 2 else "multiples of 16"
    with pytest.raises(
        NoUsableBackendError, match=f"block_size 8 not supported with flash_attn_version {version} \\({rule}\\)"
    ):
        get_attn_backend(B.FLASH_ATTN, cfg(128, block_size=8), cuda(cc), assume_installed=True)


def test_fp8_kv_cache_with_flash_attn_2_is_an_error():
    ac = AttentionConfig(backend="FLASH_ATTN", flash_attn_version=2)
    with pytest.raises(NoUsableBackendError, match="kv_cache_dtype fp8 not supported with flash_attn_version 2"):
        get_attn_backend(ac, cfg(128, kv_cache_dtype="fp8", block_size=256), cuda("8.0"), assume_installed=True)


def test_backend_names_parse():
    assert AttentionConfig(backend="flash_attn").backend is B.FLASH_ATTN
    assert AttentionConfig(backend="auto").backend is None
    assert lookup_backend("flash_attn") is B.FLASH_ATTN and lookup_backend("Auto") is None
    with pytest.raises(UnknownBackendError) as e:
        lookup_backend("FLASH_ATTENTION")
    r = e.value.refusal
    assert (r.value, r.allowed, r.suggestion) == (
        "FLASH_ATTENTION",
        "FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, CPU_ATTN, auto",
        "FLASH_ATTN",
    )
    with pytest.raises(ConfigError):
        AttentionConfig(backend="FLASH_ATTENTION")


# ---------------------------------------------------------------- the matrix, against an independent table
# The declared limits, restated here on purpose (a change to a backend class must be made twice).

FA_VERSIONS = {  # version: (min cc, max cc, kv dtypes, max head, block multiple)
    2: ((8, 0), (9, 0), {"auto"}, 256, 256),
    3: ((9, 0), (9, 0), {"auto", "fp8"}, 256, 16),
    4: ((9, 0), (10, 3), {"auto"}, 128, 16),
}


def fa_ok(cc, head, dtype, block, kv):
    if dtype not in (F16, BF16):
        return False
    for lo, hi, kvs, max_head, mult in FA_VERSIONS.values():
        if lo <= cc <= hi and kv in kvs and head % 8 == 0 and head <= max_head and block % mult == 0:
            return True
    return False


def fi_ok(cc, head, dtype, block, kv):
    return (7, 5) <= cc <= (12, 1) and dtype in (F16, BF16) and head in (64, 128, 256) and block in (16, 32, 64)


def triton_ok(cc, head, dtype, block, kv):
    return cc >= (7, 0) and head >= 32 and block % 16 == 0


def flex_ok(cc, head, dtype, block, kv):
    return kv == "auto"


def expected_cuda(cc, head, dtype, block, kv):
    order = [("FLASH_ATTN", fa_ok), ("FLASHINFER", fi_ok), ("TRITON_ATTN", triton_ok)]
    if cc[0] == 9:
        order = [order[2], order[0], order[1]]
    elif cc[0] == 10:
        order = [order[1], order[0], order[2]]
    for name, ok in order + [("FLEX_ATTENTION", flex_ok)]:
        if ok(cc, head, dtype, block, kv):
            return name
    return None


CCS = [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]
MATRIX = list(itertools.product(CCS, (64, 80, 96, 128, 256), (F16, BF16, F32), (8, 16, 32, 64), ("auto", "fp8")))


def test_matrix_cuda():
    """Every CC x head size x dtype x block size x KV dtype on CUDA (960 cases) picks the oracle's backend."""
    mismatches = []
    for cc, head, dtype, block, kv in MATRIX:
        config = cfg(head, dtype, block_size=block, kv_cache_dtype=kv)
        want = expected_cuda(cc, head, dtype, block, kv)
        try:
            got = auto(cuda(f"{cc[0]}.{cc[1]}"), config)
        except NoUsableBackendError as e:
            got = None
            assert "\n" not in str(e)
            for name in (
                "FLASH_ATTN",
                "FLASHINFER",
                "TRITON_ATTN",
                "FLEX_ATTENTION",
            ):  # "NAME: why" or "NAME, NEXT: why"
                assert f" {name}: " in str(e) or f" {name}, " in str(e), (name, str(e))
        if got != want:
            mismatches.append((cc, head, dtype, block, kv, got, want))
    assert not mismatches, mismatches[:10]


@pytest.mark.parametrize(
    "head, dtype, block, kv",
    list(itertools.product((64, 80, 96, 128, 256), (F16, BF16, F32), (8, 16, 32, 64), ("auto", "fp8"))),
)
def test_matrix_cpu(cpu_attn_backend, head, dtype, block, kv):
    # CPU_ATTN's declared limits: any head size and block size, fp32/fp16/bf16, a 16-bit or fp8 cache
    assert auto(detect_platform("cpu"), cfg(head, dtype, block_size=block, kv_cache_dtype=kv)) == "CPU_ATTN"


# ---------------------------------------------------------------- exact reason strings


@pytest.mark.parametrize(
    "backend, cc, config, reason",
    [
        (B.FLASH_ATTN, "7.5", cfg(128), "compute capability 7.5 not supported (needs >= 8.0)"),
        (
            B.FLASH_ATTN,
            "12.0",
            cfg(128),
            "compute capability 12.0 not supported (FlashAttention 2: 8.0 to 9.0; "
            "FlashAttention 3: 9.0; FlashAttention 4: 9.0 to 10.3)",
        ),
        (
            B.FLASH_ATTN,
            "9.0",
            cfg(128, F32),
            "dtype float32 not supported with flash_attn_version 3 (supported: float16, bfloat16)",
        ),
        (
            B.FLASH_ATTN,
            "10.0",
            cfg(256),
            "head_size 256 not supported with flash_attn_version 4 (multiples of 8 up to 128)",
        ),
        (
            B.FLASH_ATTN,
            "9.0",
            cfg(100),
            "head_size 100 not supported with flash_attn_version 3 (multiples of 8 up to 256)",
        ),
        (B.FLASHINFER, "7.0", cfg(128), "compute capability 7.0 not supported (needs 7.5 to 12.1)"),
        (B.FLASHINFER, "9.0", cfg(128, block_size=128), "block_size 128 not supported (supported: 16, 32, 64)"),
        (B.FLASHINFER, "9.0", cfg(128, has_sink=True), "attention sinks not supported"),
        (B.FLASHINFER, "10.0", cfg(128, has_sink=True), "attention sinks not supported"),
        (
            B.FLASH_ATTN,
            "10.0",
            cfg(128, kv_cache_dtype="fp8"),
            "kv_cache_dtype fp8 not supported with flash_attn_version 4 (supported: auto)",
        ),
        (
            B.FLASH_ATTN,
            "9.0",
            cfg(128, kv_cache_dtype="fp8_e5m2"),
            "kv_cache_dtype fp8_e5m2 not supported with flash_attn_version 3 (supported: auto, fp8, fp8_e4m3)",
        ),
        (B.TRITON_ATTN, "9.0", cfg(16), "head_size 16 not supported (>= 32)"),
        (B.TRITON_ATTN, "9.0", cfg(128, block_size=8), "block_size 8 not supported (supported: 16, 32, 64, 128, 256)"),
        (
            B.TRITON_ATTN,
            "9.0",
            cfg(128, block_size=48),
            "block_size 48 not supported (supported: 16, 32, 64, 128, 256)",
        ),
        (B.FLEX_ATTENTION, "9.0", cfg(128, kv_cache_dtype="fp8"), "kv_cache_dtype fp8 not supported (supported: auto)"),
    ],
)
def test_reason_strings(backend, cc, config, reason):
    assert evaluate_backends(config, cuda(cc), assume_installed=True, backends=[backend])[backend.name] == [reason]


def test_explicit_invalid_raises_with_every_reason():
    with pytest.raises(NoUsableBackendError) as e:
        get_attn_backend(B.FLASHINFER, cfg(80, F32, block_size=8, has_sink=True), cuda("7.0"), assume_installed=True)
    msg = str(e.value)
    for part in (
        "compute capability 7.0 not supported (needs 7.5 to 12.1)",
        "dtype float32 not supported (supported: float16, bfloat16)",
        "head_size 80 not supported (supported: 64, 128, 256)",
        "block_size 8 not supported (supported: 16, 32, 64)",
        "attention sinks not supported",
        "Backends that would work: FLEX_ATTENTION.",
    ):
        assert part in msg


@pytest.mark.parametrize("version", [None, 2])
def test_explicit_flash_attn_on_cpu_names_every_reason(version):
    """Not only the device: the model's reasons too, against the version a GPU would run (FA3 when unset)."""
    ac = AttentionConfig(flash_attn_version=version)
    reasons = evaluate_backends(
        cfg(128, F32, block_size=8, kv_cache_dtype="fp8"),
        detect_platform("cpu"),
        ac,
        assume_installed=True,
        backends=[B.FLASH_ATTN],
    )["FLASH_ATTN"]
    v = version or 3
    rule = "multiples of 256" if v == 2 else "multiples of 16"
    kv = "auto" if v == 2 else "auto, fp8, fp8_e4m3"
    assert reasons[0] == "device cpu not supported (supported: cuda)"
    assert f"dtype float32 not supported with flash_attn_version {v} (supported: float16, bfloat16)" in reasons
    assert f"block_size 8 not supported with flash_attn_version {v} ({rule})" in reasons
    assert (f"kv_cache_dtype fp8 not supported with flash_attn_version 2 (supported: {kv})" in reasons) == (v == 2)


@pytest.mark.skipif(
    any(package_installed(p) for p in ("flash_attn", "flash_attn_interface", "flash_attn.cute")),
    reason="a FlashAttention package is installed here",
)
def test_explicit_flash_attn_on_cpu_says_it_is_not_installed():
    reasons = evaluate_backends(cfg(128, BF16), detect_platform("cpu"), backends=[B.FLASH_ATTN])["FLASH_ATTN"]
    assert reasons == [
        "device cpu not supported (supported: cuda)",
        "not installed: pip install 'attnserve[fa3]' (or 'attnserve[fa4]', 'attnserve[fa2]')",
    ]


def test_no_backend_error_lists_each_backend_with_reasons_on_one_line():
    with pytest.raises(NoUsableBackendError) as e:
        get_attn_backend(None, cfg(80, block_size=8, kv_cache_dtype="fp8"), cuda("9.0"), assume_installed=True)
    assert str(e.value) == (
        "no attention backend can run this model (head_size 80, dtype bfloat16, kv_cache_dtype fp8, block_size 8) on "
        "simulated CUDA device (compute capability 9.0): TRITON_ATTN: block_size 8 not supported (supported: 16, "
        "32, 64, 128, 256). FLASH_ATTN: block_size 8 not supported with flash_attn_version 3 (multiples of 16). "
        "FLASHINFER: head_size 80 not supported (supported: 64, 128, 256); block_size 8 not supported (supported: "
        "16, 32, 64). FLEX_ATTENTION: kv_cache_dtype fp8 not supported (supported: auto)."
    )
    # block_size 16 would let TRITON_ATTN (1st) run, kv_cache_dtype auto only FLEX_ATTENTION (4th): the block size is to blame
    assert e.value.key == "block_size"


def test_no_backend_error_lists_backends_with_the_same_reasons_together_and_names_the_setting():
    with pytest.raises(NoUsableBackendError) as e:
        get_attn_backend(None, cfg(64, F32, block_size=8, kv_cache_dtype="fp8"), cuda("9.0"), assume_installed=True)
    assert str(e.value).endswith("FLEX_ATTENTION: kv_cache_dtype fp8 not supported (supported: auto).")
    assert "TRITON_ATTN: block_size 8 not supported" in str(e.value)


def test_no_backend_error_names_the_attention_option_that_alone_keeps_the_first_backend_out():
    """CPU_ATTN (first on CPU) takes fp8 but refuses use_prefill_decode_attention; FLEX_ATTENTION (second) refuses
    fp8: the option is to blame, not --kv-cache-dtype."""
    with pytest.raises(NoUsableBackendError) as e:
        get_attn_backend(
            None,
            cfg(64, F32, kv_cache_dtype="fp8"),
            detect_platform("cpu"),
            AttentionConfig(use_prefill_decode_attention=True),
        )
    assert e.value.key == "attention_config.use_prefill_decode_attention"
    assert [r.field for r in e.value.reasons["CPU_ATTN"]] == ["use_prefill_decode_attention"]
    assert [r.field for r in e.value.reasons["FLEX_ATTENTION"]] == ["kv_cache_dtype"]


# ---------------------------------------------------------------- packages, versions, layout, cache


@pytest.mark.skipif(package_installed("flashinfer"), reason="flashinfer is installed here")
def test_missing_package_is_rejected_with_install_hint():
    with pytest.raises(NoUsableBackendError, match=r"not installed: pip install 'attnserve\[flashinfer\]'"):
        get_attn_backend(B.FLASHINFER, cfg(128), cuda("9.0"))


@pytest.mark.skipif(
    any(package_installed(p) for p in ("flash_attn", "flash_attn_interface")),
    reason="a FlashAttention package is installed here",
)
def test_missing_flash_attn_names_the_version_packages_and_still_judges_the_model():
    reasons = evaluate_backends(cfg(128, block_size=8), cuda("9.0"), backends=[B.FLASH_ATTN])["FLASH_ATTN"]
    assert reasons == [
        "not installed: pip install 'attnserve[fa3]' (or 'attnserve[fa4]', 'attnserve[fa2]')",
        "block_size 8 not supported with flash_attn_version 3 (multiples of 16)",
    ]
    ac = AttentionConfig(flash_attn_version=3)
    reasons = evaluate_backends(cfg(128), cuda("9.0"), ac, backends=[B.FLASH_ATTN])["FLASH_ATTN"]
    assert reasons == ["flash_attn_version 3 not installed: pip install 'attnserve[fa3]'"]


@pytest.mark.parametrize("cc, version", [("8.0", 3), ("8.6", 4), ("10.0", 3), ("12.0", 2)])
def test_flash_attn_version_that_does_not_support_the_gpu(cc, version):
    ac = AttentionConfig(flash_attn_version=version)
    reasons = evaluate_backends(cfg(128, block_size=256), cuda(cc), ac, True, [B.FLASH_ATTN])["FLASH_ATTN"]
    assert reasons[0].startswith(
        f"flash_attn_version {version} not supported on compute capability {cc} (FlashAttention {version} needs "
    )


@pytest.mark.parametrize(
    "cc, config, version",
    [
        ("9.0", cfg(128), 3),
        ("9.0", cfg(128, has_sink=True), 4),
        ("10.0", cfg(128), 4),
        ("8.0", cfg(128, block_size=256), 2),
    ],
)
def test_flash_attn_version_resolution(cc, config, version):
    sel = select_attn_backend(B.FLASH_ATTN, config, cuda(cc), assume_installed=True)
    assert sel.flash_attn_version == version


def test_flashinfer_on_blackwell_with_trtllm_unset_runs_its_own_kernels_in_either_layout():
    """TRT-LLM kernels are not wired: unset never asks for them (nor for their HND layout), so Blackwell loads."""
    for flag in (None, False):
        ac = AttentionConfig(use_trtllm_attention=flag)
        for layout in (KVCacheLayout.NHD, KVCacheLayout.HND):
            sel = select_attn_backend(ac, cfg(128), cuda("10.0"), assume_installed=True, kv_cache_layout=layout)
            assert (sel.name, sel.kv_cache_layout) == ("FLASHINFER", layout)
    assert select_attn_backend(None, cfg(128), cuda("10.0"), assume_installed=True).kv_cache_layout == KVCacheLayout.NHD


def test_trtllm_forced_on_blackwell_is_refused_as_not_wired():
    ac = AttentionConfig(backend="FLASHINFER", use_trtllm_attention=True)
    with pytest.raises(
        NoUsableBackendError,
        match="use_trtllm_attention=True not supported: FlashInfer's TRT-LLM kernels are not wired",
    ):
        get_attn_backend(ac, cfg(128), cuda("10.0"), assume_installed=True)


def test_user_layout_kept_when_backend_has_no_requirement():
    sel = select_attn_backend(None, cfg(128), cuda("9.0"), assume_installed=True, kv_cache_layout=KVCacheLayout.HND)
    assert sel.kv_cache_layout == KVCacheLayout.HND
    assert select_attn_backend(None, cfg(128), cuda("9.0"), assume_installed=True).kv_cache_layout == KVCacheLayout.NHD


def test_trtllm_forced_on_hopper_is_a_reason():
    ac = AttentionConfig(backend="FLASHINFER", use_trtllm_attention=True)
    with pytest.raises(
        NoUsableBackendError, match=r"use_trtllm_attention=True needs compute capability 10.x \(this device: 9.0\)"
    ):
        get_attn_backend(ac, cfg(128), cuda("9.0"), assume_installed=True)


def test_selection_is_cached():
    a = select_attn_backend(None, cfg(128), cuda("9.0"), assume_installed=True)
    assert select_attn_backend(None, cfg(128), cuda("9.0"), assume_installed=True) is a


def test_automatic_selection_logs_choice(caplog):
    with caplog.at_level("DEBUG", logger="attnserve.attention.selector"):
        select_attn_backend(None, cfg(80), cuda("8.0"), assume_installed=True)
    assert (
        "Using TRITON_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', "
        "'TRITON_ATTN', 'FLEX_ATTENTION']" in caplog.text
    )
    assert "attention backend FLASHINFER skipped: head_size 80 not supported" in caplog.text


def test_kv_cache_shapes_and_stride_orders():
    from attnserve.attention.backends.flash_attn import FlashAttentionBackend
    from attnserve.attention.backends.flashinfer import FlashInferBackend

    assert FlashAttentionBackend.get_kv_cache_shape(10, 16, 2, 64) == (2, 10, 16, 2, 64)
    assert FlashInferBackend.get_kv_cache_shape(10, 16, 2, 64) == (10, 2, 16, 2, 64)
    for cls in (FlashAttentionBackend, FlashInferBackend):
        assert cls.get_kv_cache_stride_order(KVCacheLayout.NHD) == (0, 1, 2, 3, 4)
        assert cls.get_kv_cache_stride_order(KVCacheLayout.HND) == (0, 1, 3, 2, 4)
    # issue 6 implemented the kernels: the factories return classes (importing no kernel library)
    assert FlashInferBackend.get_impl_cls().__name__ == "FlashInferImpl"
