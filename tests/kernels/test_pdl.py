"""``attnserve/kernels/pdl.py``: the process-wide PDL launch option, and where it never applies (CPU tensors,
the Triton interpreter). On the GPU: ``tests/gpu/test_pdl_gpu.py``."""

from __future__ import annotations

import torch

from attnserve.config.engine import EngineConfig
from attnserve.kernels import pdl


def test_launch_options_follow_the_switch_and_never_apply_to_cpu_tensors():
    cpu = torch.zeros(2)
    try:
        assert pdl.configure(True) is True and pdl.enabled() is True
        assert pdl.launch(cpu) == {"USE_PDL": False}  # CPU tensors (the interpreter) never launch with PDL
        assert pdl.configure(False) is False and pdl.enabled() is False
        assert pdl.launch(cpu) == {"USE_PDL": False}
    finally:
        pdl.configure(False)


def test_cpu_does_not_support_pdl_and_the_engine_default_asks_for_it():
    assert pdl.supported("cpu") is False
    assert EngineConfig().enable_pdl is True
    assert EngineConfig(enable_pdl=False).enable_pdl is False
