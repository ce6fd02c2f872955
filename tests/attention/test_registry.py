"""Registry: lazy class paths, register_backend (call, decorator, new names, entry points), cache clearing."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from attnserve.attention import registry
from attnserve.attention.backend import AttentionBackend, CudaGraphSupport
from attnserve.attention.backends.triton_attn import TritonAttentionBackend
from attnserve.attention.registry import AttentionBackendEnum as B
from attnserve.attention.registry import get_backend_class, lookup_backend, register_backend, registered_names
from attnserve.attention.selector import NoUsableBackendError, get_attn_backend, select_attn_backend
from attnserve.platforms import detect_platform
from tests.attention.conftest import cfg, cuda

KERNEL_AND_SERVER_MODULES = ("flash_attn", "flash_attn_interface", "flashinfer", "triton", "fastapi", "uvicorn")


def _loaded_after(code: str) -> list[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code + f"\nimport sys\nprint(' '.join(m for m in {KERNEL_AND_SERVER_MODULES!r} if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def test_import_attnserve_imports_no_kernel_or_server_library():
    assert _loaded_after("import attnserve") == []


def test_backend_declarations_and_selection_import_no_kernel_library():
    code = (
        "import torch\nfrom attnserve.attention.registry import AttentionBackendEnum as B\n"
        "from attnserve.attention.selector import evaluate_backends, AttentionSelectorConfig\n"
        "from attnserve.platforms import detect_platform\n"
        "evaluate_backends(AttentionSelectorConfig(128, torch.bfloat16), detect_platform('cuda:9.0'))\n"
        "[m.get_class() for m in (B.FLASH_ATTN, B.FLASHINFER, B.TRITON_ATTN, B.FLEX_ATTENTION)]"
    )
    assert _loaded_after(code) == []


def test_members_map_to_lazy_class_paths():
    assert B.FLASH_ATTN.get_path() == "attnserve.attention.backends.flash_attn.FlashAttentionBackend"
    assert B.TRITON_ATTN.get_class() is TritonAttentionBackend
    with pytest.raises(ValueError, match="CUSTOM has no class registered"):
        B.CUSTOM.get_class()
    assert "CUSTOM" not in registered_names()


class FakeBackend(AttentionBackend):
    """Runs anything on CUDA, any dtype; no package."""

    name = "FAKE"
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3")
    cuda_graph_support = CudaGraphSupport.ALWAYS

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError

    @staticmethod
    def get_builder_cls():
        raise NotImplementedError


def test_override_is_used_by_explicit_and_automatic_selection():
    platform, config = cuda("7.0"), cfg(80, block_size=8)  # nothing built in runs this on a V100 except FLEX
    assert select_attn_backend(None, config, platform, assume_installed=True).name == "FLEX_ATTENTION"
    register_backend(B.FLASH_ATTN, f"{__name__}.FakeBackend")
    assert get_attn_backend(B.FLASH_ATTN, config, platform) is FakeBackend
    sel = select_attn_backend(None, config, platform, assume_installed=True)  # the cache was cleared
    assert (sel.name, sel.backend_cls) == ("FLASH_ATTN", FakeBackend)


def test_register_clears_the_selector_cache():
    platform, config = cuda("8.0"), cfg(128)  # FLASH_ATTN first in the priority list
    first = get_attn_backend(None, config, platform, assume_installed=True)
    register_backend(B.FLASH_ATTN, FakeBackend)
    assert first is not FakeBackend
    assert get_attn_backend(None, config, platform, assume_installed=True) is FakeBackend


def test_decorator_registers_custom_and_new_names():
    @register_backend(B.CUSTOM)
    class MyBackend(FakeBackend):
        pass

    @register_backend("my-attn")
    class Other(FakeBackend):
        pass

    assert B.CUSTOM.get_class() is MyBackend
    assert lookup_backend("my_attn") == "MY_ATTN" and get_backend_class("MY_ATTN") is Other
    assert registered_names()[-2:] == ["CUSTOM", "MY_ATTN"]
    assert get_attn_backend(B.CUSTOM, cfg(80), cuda("7.0")) is MyBackend
    assert get_attn_backend("MY_ATTN", cfg(80), cuda("7.0")) is Other


def test_unknown_name_lists_valid_names():
    with pytest.raises(registry.UnknownBackendError, match="unknown attention backend 'nope'"):
        lookup_backend("nope")


def test_missing_module_is_a_reason():
    register_backend("BROKEN", "attnserve.no_such_module.Backend")
    with pytest.raises(NoUsableBackendError, match="cannot be loaded: No module named 'attnserve.no_such_module'"):
        get_attn_backend("BROKEN", cfg(128), cuda("9.0"))


def test_entry_points_are_read_without_importing(monkeypatch):
    eps = [
        SimpleNamespace(name="ep_attn", value=f"{__name__}:FakeBackend"),
        SimpleNamespace(name="TRITON_ATTN", value="somepkg.never_imported:Backend"),
    ]
    import importlib.metadata

    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: eps if group == registry.ENTRY_POINT_GROUP else []
    )
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    assert lookup_backend("EP_ATTN") == "EP_ATTN"
    assert B.TRITON_ATTN.get_path() == "somepkg.never_imported.Backend"
    assert "somepkg" not in sys.modules
    assert get_backend_class("EP_ATTN") is FakeBackend


def test_cpu_stand_in_selected_on_cpu():
    class CPUStandIn(FakeBackend):
        device_types = ("cpu",)

    register_backend(B.CPU_ATTN, CPUStandIn)
    assert get_attn_backend(None, cfg(80, torch.float32, block_size=8), detect_platform("cpu")) is CPUStandIn
    with pytest.raises(NoUsableBackendError, match="device cuda not supported \\(supported: cpu\\)"):
        get_attn_backend(B.CPU_ATTN, cfg(128), cuda("9.0"))


def test_platform_strings():
    p = detect_platform("cuda:9.0")
    assert (p.device_type, p.compute_capability, p.simulated) == ("cuda", (9, 0), True)
    assert p.description == "simulated CUDA device (compute capability 9.0)"
    assert detect_platform("CPU").device_type == "cpu"
    assert detect_platform("cuda:10.0") is detect_platform("cuda:10.0")  # detected once
    with pytest.raises(ValueError, match="device 'tpu' not understood"):
        detect_platform("tpu")
