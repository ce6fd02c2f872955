"""Every installed GPU backend (each FlashAttention version) that claims the logits soft cap and the sliding
window, against the reference on Gemma-2-9B's attention shape (``cases.gemma_cases``: head 256, GQA 2, soft cap,
window 48 on every named batch shape). A backend or version that refuses the shape on this GPU is skipped with
its reasons; it must not refuse for the soft cap or the window when its class claims them, unless its installed
build compiled them out (FA3's ``flash_attn_config``: the reason names the switch). Run on the H200:
``pytest tests/gpu/test_softcap_window_gpu.py -m gpu -s``."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.backends import gpu_targets
from tests.gpu.cases import gemma_cases, run_case
from tests.gpu.conftest import RESULTS, save_results

pytestmark = pytest.mark.gpu


def _params():
    params = []
    for label, name, cfg, _ in gpu_targets() if torch.cuda.is_available() else []:
        block = 256 if label == "FLASH_ATTN/2" else 16  # FA2's paged KV takes blocks of 256
        dtypes = (torch.bfloat16, torch.float32) if name in ("TRITON_ATTN", "FLEX_ATTENTION") else (torch.bfloat16,)
        params += [
            pytest.param(label, name, cfg, case, id=f"{label}-{case.name}")
            for case in gemma_cases(block_size=block, dtypes=dtypes)
        ]
    return params


@pytest.mark.parametrize("label,backend_name,attention_config,case", _params())
def test_soft_cap_and_window_match_reference(label, backend_name, attention_config, case):
    from attnserve.attention.registry import AttentionBackendEnum
    from attnserve.attention.selector import AttentionSelectorConfig
    from attnserve.attention.validation import build_limited
    from attnserve.platforms import detect_platform

    backend_cls = AttentionBackendEnum[backend_name].get_class()
    platform = detect_platform("cuda")
    caps = backend_cls.capabilities(platform, attention_config)
    cfg = AttentionSelectorConfig(
        head_size=case.head_size,
        dtype=case.dtype,
        block_size=case.block_size,
        sliding_window=case.sliding_window,
        logits_soft_cap=case.logits_soft_cap,
    )
    reasons = backend_cls.validate(cfg, platform, attention_config)
    compiled_out = {field for field, _ in caps.build_limits}
    for claimed, field in ((caps.logits_soft_cap, "logits_soft_cap"), (caps.sliding_window, "sliding_window")):
        assert claimed or field in compiled_out, f"{label} claims no {field}: {caps}"
    if reasons:
        features = ("logits_soft_cap", "sliding_window")
        assert not [r for r in reasons if r.field in features and not build_limited(r)], reasons
        pytest.skip(f"{label} cannot run {case.name}: {'; '.join(reasons)}")
    row = {"backend": label, "version": "-", "case": case.name, **run_case(backend_cls, case, "cuda", attention_config)}
    RESULTS.append(row)
    save_results()
    print(f"{label} {case.name} rel_err={row['rel_err']:.2e} pass={row['pass']}", flush=True)
    assert not row["nan"] and row["pass"], row
