"""``use_skinny_gemm`` resolved: unset is on wherever the plan has an effect (CUDA, CUDA graphs, Triton) and
silently off elsewhere; True warns where it has no effect; False is off. Platforms as ``attnserve config`` plans
them (``cuda:9.0``: a simulated GPU)."""

from __future__ import annotations

import pytest

from attnserve.gemv.enable import SkinnyGemm, resolve_skinny_gemm
from attnserve.platforms import detect_platform

# (device, CUDA graphs, Triton) -> what it lacks (None: the plan applies)
WHERE = [
    ("cpu", False, True, "no CUDA"),
    ("cpu", True, True, "no CUDA"),
    ("cuda:9.0", False, True, "CUDA graphs off"),
    ("cuda:9.0", True, False, "Triton not installed"),
    ("cuda:9.0", True, True, None),
]


@pytest.mark.parametrize("device, graphs, triton, lacks", WHERE)
@pytest.mark.parametrize("requested", [None, True, False])
def test_resolution(device, graphs, triton, lacks, requested):
    got = resolve_skinny_gemm(requested, detect_platform(device).device_type, graphs, triton)
    if requested is False:
        assert got == SkinnyGemm(False, "use_skinny_gemm false")
    elif lacks is None:
        assert got == SkinnyGemm(True, "CUDA, CUDA graphs, Triton")
    else:  # unset: off without a word; True: off with a warning
        assert got == SkinnyGemm(False, lacks, warn=requested is True)


def test_warnings_say_what_is_missing():
    cpu = resolve_skinny_gemm(True, "cpu", False, True)
    assert cpu.warning() == (
        "use_skinny_gemm has no effect here: the Triton GEMV runs in CUDA-graph decode steps only "
        "(this engine: no CUDA)"
    )
    assert resolve_skinny_gemm(True, "cuda", False, True).warning().endswith("(this engine: CUDA graphs off)")
    no_triton = resolve_skinny_gemm(True, "cuda", True, False)
    assert (
        no_triton.warning() == "use_skinny_gemm has no effect here: the GEMV plan needs Triton, which is not installed"
    )
    assert no_triton.explained() == "off (Triton not installed)"


def test_warn_if_ignored_logs_once_for_an_ignored_true_only(caplog):
    from attnserve.gemv.enable import warn_if_ignored

    with caplog.at_level("WARNING", logger="attnserve.gemv"):
        for requested in (None, False, True):
            warn_if_ignored(resolve_skinny_gemm(requested, "cpu", False, True))
    assert [r.getMessage() for r in caplog.records] == [resolve_skinny_gemm(True, "cpu", False, True).warning()]
