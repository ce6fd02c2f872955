"""FlashAttention 3's limits follow its installed build (``flash_attn_config.CONFIG["build_flags"]``, the module
FA3's hopper/setup.py writes beside ``flash_attn_interface``): a build without soft-capping is refused for Gemma 2
with the switch named, automatic selection moves on, ``attnserve backends`` says so; no build config (or
``--assume-installed``, planning for another machine): the declared limits. The build config is simulated here
(a module in ``sys.modules``), as the selector tests simulate a GPU."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from attnserve.attention.backends.flash_attn import FlashAttentionBackend as FA
from attnserve.attention.backends.flash_attn_versions import FLASH_ATTN_VERSIONS, installed_build
from attnserve.attention.registry import AttentionBackendEnum as B
from attnserve.attention.selector import evaluate_backends, select_attn_backend
from attnserve.attention.validation import build_limited
from attnserve.config.attention import AttentionConfig
from tests.attention.conftest import cfg, cuda

# the staged FA3 wheel on the H200 (2026-12-02): no backward, no soft cap, no head-size-96 kernels, no SM8x kernels
H200_BUILD = {
    "FLASHATTENTION_DISABLE_BACKWARD": True,
    "FLASHATTENTION_DISABLE_SPLIT": False,
    "FLASHATTENTION_DISABLE_PAGEDKV": False,
    "FLASHATTENTION_DISABLE_APPENDKV": False,
    "FLASHATTENTION_DISABLE_LOCAL": False,
    "FLASHATTENTION_DISABLE_SOFTCAP": True,
    "FLASHATTENTION_DISABLE_PACKGQA": False,
    "FLASHATTENTION_DISABLE_FP16": False,
    "FLASHATTENTION_DISABLE_FP8": False,
    "FLASHATTENTION_DISABLE_VARLEN": False,
    "FLASHATTENTION_DISABLE_CLUSTER": False,
    "FLASHATTENTION_DISABLE_HDIM64": False,
    "FLASHATTENTION_DISABLE_HDIM96": True,
    "FLASHATTENTION_DISABLE_HDIM128": False,
    "FLASHATTENTION_DISABLE_HDIM192": False,
    "FLASHATTENTION_DISABLE_HDIM256": False,
    "FLASHATTENTION_DISABLE_SM8x": True,
    "FLASHATTENTION_ENABLE_VCOLMAJOR": False,
}
GEMMA2 = dict(head_size=256, dtype=torch.bfloat16, block_size=16, sliding_window=4096, logits_soft_cap=50.0)
FA3 = AttentionConfig(flash_attn_version=3)
SOFTCAP = "FLASHATTENTION_DISABLE_SOFTCAP"


@pytest.fixture
def fa3_build(monkeypatch):
    """``fa3_build(**switches)``: an installed FA3 build config with H200_BUILD's flags changed by ``switches``
    (``SOFTCAP=False``); ``fa3_build(None)``: none importable; ``fa3_build(value)``: ``CONFIG = value``."""

    def install(config: object = "h200", **switches: bool) -> None:
        if config is None:
            monkeypatch.delitem(sys.modules, "flash_attn_config", raising=False)
            monkeypatch.setattr("attnserve.attention.backends.flash_attn_versions.package_installed", lambda m: False)
            return
        module = types.ModuleType("flash_attn_config")
        flags = {**H200_BUILD, **{f"FLASHATTENTION_DISABLE_{k}": v for k, v in switches.items()}}
        module.CONFIG = {"build_flags": flags} if config == "h200" else config
        monkeypatch.setitem(sys.modules, "flash_attn_config", module)
        # the build file describes the kernels beside it: FA3's interface counts as installed
        monkeypatch.setattr(
            "attnserve.attention.backends.flash_attn_versions.package_installed",
            lambda m: m in ("flash_attn_interface", "flash_attn_config"),
        )

    return install


@pytest.fixture
def installed(monkeypatch):
    """``installed(*versions)``: these FlashAttention versions' packages count as installed (``flash_attn_interface``
    for 3, ``flash_attn`` for 2, ``flash_attn.cute`` for 4), no other; every other backend's package too, but
    Triton's: TRITON_ATTN leads CC 9.x's list, and these tests are about what FlashAttention serves after it."""

    def install(*versions: int) -> None:
        packages = {FLASH_ATTN_VERSIONS[v].package for v in versions}
        fa = {v.package for v in FLASH_ATTN_VERSIONS.values()}

        def found(module: str) -> bool:
            return module in packages or (module not in fa and module != "triton")

        monkeypatch.setattr("attnserve.attention.backends.flash_attn.package_installed", found)
        monkeypatch.setattr("attnserve.attention.validation.package_installed", found)

    return install


def test_h200_build_takes_the_soft_cap_from_version_3_only(fa3_build):
    fa3_build()
    assert installed_build(3).disabled == {"BACKWARD", "SOFTCAP", "HDIM96", "SM8x"}
    assert installed_build(2) is None and installed_build(4) is None
    caps = FA.version_capabilities(3)
    assert (caps.logits_soft_cap, caps.sliding_window, caps.max_head_size) == (False, True, 256)
    assert caps.kv_cache_dtypes == ("auto", "fp8", "fp8_e4m3") and caps.dtypes == (torch.float16, torch.bfloat16)
    assert caps.build_limits == (("logits_soft_cap", SOFTCAP),) and caps.build_refusals == ()
    assert caps.compute_capability_rule() == "9.0"  # the build's SM8x switch changes nothing: FA3 is Hopper-only
    assert FA.version_capabilities(3, declared=True).logits_soft_cap
    assert FA.version_capabilities(2).logits_soft_cap and FA.version_capabilities(4).logits_soft_cap


@pytest.mark.parametrize("config", [None, {"no build_flags": 1}, "not a dict"])
def test_without_a_readable_build_config_the_declared_limits_stand(fa3_build, config):
    fa3_build(config)
    assert installed_build(3) is None
    assert FA.version_capabilities(3) == FA.version_capabilities(3, declared=True)


def test_gemma2_on_version_3_is_refused_naming_the_switch(fa3_build, installed):
    fa3_build()
    installed(3)
    [reason] = evaluate_backends(cfg(**GEMMA2), cuda("9.0"), FA3, backends=[B.FLASH_ATTN])["FLASH_ATTN"]
    assert (reason.field, reason.value, reason.rule) == ("logits_soft_cap", 50.0, f"this build: {SOFTCAP}")
    assert SOFTCAP in reason and build_limited(reason)
    # planning for another machine judges the declared limits
    assert FA.validate(cfg(**GEMMA2), cuda("9.0"), FA3, assume_installed=True) == []


def test_automatic_selection_moves_on(fa3_build, installed):
    """FLASH_ATTN without a version picks another installed version that serves the model (here FA2, whose paged
    KV takes blocks of 256); with none, automatic selection takes the next backend, and FLASH_ATTN's reason names
    the switch."""
    fa3_build()
    installed(3, 2)
    sel = select_attn_backend(B.FLASH_ATTN, cfg(**{**GEMMA2, "block_size": 256}), cuda("9.0"))
    assert sel.flash_attn_version == 2
    installed(3)
    sel = select_attn_backend(None, cfg(**GEMMA2), cuda("9.0"))
    assert sel.name == "FLASHINFER"
    [reason] = sel.reasons["FLASH_ATTN"]
    assert (reason.field, reason.rule) == ("logits_soft_cap", f"this build: {SOFTCAP}")


def test_models_the_build_serves_still_get_version_3(fa3_build, installed):
    """Without a soft cap (a window, head size 256 or 96: the build has no head-size-96 kernels, and FA3 runs such
    heads on the next compiled size, 128), the H200 build serves the model."""
    fa3_build()
    installed(3)
    for config in (cfg(256, sliding_window=128), cfg(96), cfg(64, kv_cache_dtype="fp8")):
        sel = select_attn_backend(None, config, cuda("9.0"))
        assert (sel.name, sel.flash_attn_version) == ("FLASH_ATTN", 3), config


@pytest.mark.parametrize(
    "switches, config, field, value, rule",
    [
        ({"HDIM256": True}, cfg(256), "head_size", 256, "multiples of 8 up to 192; this build: {P}HDIM256"),
        (
            {"HDIM192": True, "HDIM256": True},
            cfg(160),
            "head_size",
            160,
            "multiples of 8 up to 128; this build: {P}HDIM192, {P}HDIM256",
        ),
        ({"FP8": True}, cfg(128, kv_cache_dtype="fp8"), "kv_cache_dtype", "fp8", "auto; this build: {P}FP8"),
        ({"LOCAL": True}, cfg(128, sliding_window=128), "sliding_window", 128, "this build: {P}LOCAL"),
        ({"FP16": True}, cfg(128, torch.float16), "dtype", torch.float16, "bfloat16; this build: {P}FP16"),
        ({"PAGEDKV": True}, cfg(128), "build", "{P}PAGEDKV", "a build without {P}PAGEDKV"),
        ({"VARLEN": True}, cfg(128), "build", "{P}VARLEN", "a build without {P}VARLEN"),
    ],
)
def test_each_switch_is_a_reason_naming_it(fa3_build, installed, switches, config, field, value, rule):
    fa3_build(**switches)
    installed(3)
    p = "FLASHATTENTION_DISABLE_"
    [reason] = FA.validate(config, cuda("9.0"), FA3)
    value = value.format(P=p) if isinstance(value, str) else value
    assert (reason.field, reason.value, reason.rule) == (field, value, rule.format(P=p))
    assert build_limited(reason)
    assert FA.validate(config, cuda("9.0"), FA3, assume_installed=True) == []  # planning: the declared limits


def test_backends_command_names_the_switch_for_gemma2(fa3_build, installed, capsys):
    from attnserve.entrypoints.cli import backends

    fa3_build()
    installed(3)
    assert backends.main(["--model", "benchmarks/shapes/gemma-2-9b", "--device", "cuda:9.0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["selected"] == "FLASHINFER"
    for group in report["groups"]:
        assert group["backends"]["FLASH_ATTN"]["reasons"] == [
            f"logits_soft_cap 50.0 not supported with flash_attn_version 3; this build: {SOFTCAP}"
        ]


def test_a_build_file_without_the_kernels_describes_nothing(monkeypatch):
    """A ``flash_attn_config`` left behind without ``flash_attn_interface``: the declared limits, no build reason."""
    module = types.ModuleType("flash_attn_config")
    module.CONFIG = {"build_flags": {**H200_BUILD}}
    monkeypatch.setitem(sys.modules, "flash_attn_config", module)
    monkeypatch.setattr("attnserve.attention.backends.flash_attn_versions.package_installed", lambda m: False)
    assert installed_build(3) is None
    assert FA.version_capabilities(3) == FA.version_capabilities(3, declared=True)
