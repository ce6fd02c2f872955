"""Every architecture x every GPU attention backend (run on the H200): tiny random models with head size 64.

A backend that can run the model must generate, with its prompt logits close to transformers' float32 CPU
logits and its first greedy token equal; for the sliding-window Mistral its logits must be closer to the
windowed reference than to the same weights without the window (so the window really is applied, in
prefill, chunked prefill and decode). A backend whose only objection is the sliding window must be
rejected with that reason; a backend that is not installed or cannot run for another reason is skipped,
with its reasons.
"""

from __future__ import annotations

import pytest
import torch

from attnserve import LLM, SamplingParams
from attnserve.attention.registry import AttentionBackendEnum
from attnserve.attention.selector import AttentionSelectorConfig, NoUsableBackendError, backend_reasons
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from tests.helpers import hf_greedy
from tests.models.tiny import SLIDING_WINDOW

pytestmark = pytest.mark.gpu

ARCHS = ["gpt2", "opt", "opt_post_ln", "mistral_sw", "llama3", "qwen3"]
BACKENDS = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]
DTYPES = ["bfloat16", "float16"]
BLOCK_SIZE = 16
# |logits - float32 reference| / max|reference|: a tiny random model's logits after 2 layers in 16-bit math
REL_TOL = {"bfloat16": 0.05, "float16": 0.01}
PROMPTS = [list(range(100, 130)), [2, 44, 9000, 13, 77, 1200, 5, 6, 7, 8, 9, 10, 11], [15]]  # 30, 13, 1 tokens


def _reasons(backend: str, path: str, dtype: str) -> list[str]:
    from transformers import AutoConfig

    from attnserve.models.registry import get_model_class
    from attnserve.platforms import detect_platform

    hf_config = AutoConfig.from_pretrained(path)
    dims = get_model_class(hf_config).dims(hf_config)
    cfg = AttentionSelectorConfig(
        head_size=dims.head_size, dtype=getattr(torch, dtype), block_size=BLOCK_SIZE, sliding_window=dims.sliding_window
    )
    return backend_reasons(AttentionBackendEnum[backend], cfg, detect_platform("cuda"))[1]


def _prompt_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:  # (vocab,) float32 on CPU
    params = SamplingParams(temperature=0.0, max_tokens=1)
    num_blocks = -(-len(prompt) // BLOCK_SIZE)
    reqs = [ScheduledRequest("logits", prompt, 0, list(range(num_blocks)), params, True)]
    return llm.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0].float().cpu()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_architecture_generates_on_backend(arch, backend, dtype, gpu_model_dir):
    from transformers import AutoModelForCausalLM

    path = gpu_model_dir(arch)
    reasons = _reasons(backend, path, dtype)
    sliding_only = [r for r in reasons if not r.startswith("sliding_window")] == []
    if reasons and sliding_only:
        with pytest.raises(NoUsableBackendError, match="sliding_window"):
            LLM(path, attention_backend=backend, dtype=dtype, block_size=BLOCK_SIZE)
        return
    if reasons:
        pytest.skip(f"{backend} cannot run {arch} in {dtype}: {'; '.join(reasons)}")

    # a small token budget so that the 30-token prompt is prefilled in chunks next to the others' decodes
    llm = LLM(
        path,
        attention_backend=backend,
        dtype=dtype,
        block_size=BLOCK_SIZE,
        max_num_batched_tokens=16,
        kv_cache_memory=64 << 20,
    )
    assert llm.engine.runner.backend.name == backend
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs):
        tokens = out.outputs[0].token_ids
        assert len(tokens) == 24
        assert tokens[0] == hf_greedy(hf, prompt, 1)[0][0]

    ours = _prompt_logits(llm, PROMPTS[0])
    ref = hf_greedy(hf, PROMPTS[0], 0)[1]
    assert (ours - ref).abs().max().item() <= REL_TOL[dtype] * ref.abs().max().item()
    if arch == "mistral_sw":
        full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, sliding_window=None).eval()
        ref_full = hf_greedy(full, PROMPTS[0], 0)[1]
        assert len(PROMPTS[0]) > SLIDING_WINDOW
        assert (ours - ref).abs().max() < (ours - ref_full).abs().max()
