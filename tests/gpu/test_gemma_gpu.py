"""Tiny random Gemma 2 (soft caps, a window of 8 on even layers) and Gemma 3 (2 local : 1 global, q/k norms)
with heads of 128 on every GPU backend (run on the H200): each layer group gets the backend; in bfloat16 the
prompt logits are close to transformers' float32 CPU logits and closer to them than to the same weights without
the window (Gemma 2: or without the attention soft cap), the first greedy token equal; in float32 (backends that
run it) all 20 greedy tokens equal transformers'. Prompts are prefilled in chunks beside other requests' decodes.
A backend that cannot run the model here is skipped with its reasons (never for the soft cap or the window, which
every GPU backend claims, unless the installed build compiled them out: FA3's ``flash_attn_config``)."""

from __future__ import annotations

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.attention.selector import NoUsableBackendError
from attnserve.attention.validation import build_limited
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from tests.helpers import hf_greedy
from tests.models.tiny import SLIDING_WINDOW

pytestmark = pytest.mark.gpu

BACKENDS = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]
BLOCK_SIZE = 16
REL_TOL = {"bfloat16": 0.05}
PROMPTS = [list(range(100, 130)), [7, 8, 9] * 7, list(range(2000, 2011)), [15]]  # 30, 21, 11, 1 tokens


def _prompt_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:  # (vocab,) float32 on CPU
    params = SamplingParams(temperature=0.0, max_tokens=1)
    reqs = [ScheduledRequest("logits", prompt, 0, list(range(-(-len(prompt) // BLOCK_SIZE))), params, True)]
    return llm.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0].float().cpu()


def _llm(path: str, backend: str, dtype: str) -> LLM:
    try:
        return LLM(
            path,
            attention_backend=backend,
            dtype=dtype,
            block_size=BLOCK_SIZE,
            max_num_batched_tokens=16,
            kv_cache_memory=64 << 20,
        )
    except NoUsableBackendError as e:
        reasons = [r for rs in e.reasons.values() for r in rs]
        features = ("logits_soft_cap", "sliding_window")
        assert not [r for r in reasons if getattr(r, "field", None) in features and not build_limited(r)], str(e)
        pytest.skip(f"{backend} cannot run it in {dtype}: {e}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_bfloat16_close_to_transformers(arch, backend, gpu_model_dir):
    from transformers import AutoModelForCausalLM

    path = gpu_model_dir(arch)
    llm = _llm(path, backend, "bfloat16")
    groups = llm.engine.runner.attention.groups
    assert len(groups) == 2 and {g.selection.name for g in groups} == {backend}
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        assert len(out.outputs[0].token_ids) == 20
        assert out.outputs[0].token_ids[0] == hf_greedy(hf, prompt, 1)[0][0]
    ours = _prompt_logits(llm, PROMPTS[0])
    ref = hf_greedy(hf, PROMPTS[0], 0)[1]
    assert len(PROMPTS[0]) > SLIDING_WINDOW
    assert (ours - ref).abs().max().item() <= REL_TOL["bfloat16"] * ref.abs().max().item()
    changes = [{"sliding_window": 4096}] + ([{"attn_logit_softcapping": None}] if arch == "gemma2" else [])
    for change in changes:
        other = hf_greedy(
            AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32, attn_implementation="eager", **change
            ).eval(),
            PROMPTS[0],
            0,
        )[1]
        assert (ours - ref).abs().max() < (ours - other).abs().max(), change


@pytest.mark.parametrize("backend", ["TRITON_ATTN", "FLEX_ATTENTION"])
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_float32_greedy_tokens_equal_transformers(arch, backend, gpu_model_dir):
    from transformers import AutoModelForCausalLM

    path = gpu_model_dir(arch)
    llm = _llm(path, backend, "float32")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)[0]
