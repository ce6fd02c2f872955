"""The mixture-of-experts architectures on the GPU (tiny random models, head size 64/128): the Triton fused MoE
inside the model, in eager prefill and in the decode CUDA graphs, with TRITON_ATTN (gpt-oss: its sinks in the
Triton kernel):

- float32: prompt logits within 1e-3 (relative) of transformers' float32 CPU logits, and the greedy tokens equal;
- bfloat16: prompt logits within 5% and the first greedy token equal.

The reference is ``hf_reference``: transformers up to 5.17 ignores gpt-oss's ``swiglu_limit`` (0.5 in the tiny
models) and clamps at 7.0; the helper gives its experts the config's limit, which attnserve reads.

``python -m pytest tests/gpu/test_moe_models_gpu.py -q`` on a GPU (skipped without CUDA).
"""

from __future__ import annotations

import pytest

from attnserve import LLM, SamplingParams
from tests.helpers import hf_greedy, hf_reference

pytestmark = pytest.mark.gpu

ARCHS = ["qwen3_moe", "mixtral_sw", "gpt_oss", "gpt_oss_sw"]
PROMPTS = [list(range(100, 130)), [2, 44, 9000, 13, 77, 1200, 5, 6, 7, 8, 9, 10, 11], [15]]
REL_TOL = {"float32": 1e-3, "bfloat16": 0.05}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_moe_model_on_gpu_matches_transformers(arch, dtype, gpu_model_dir):
    path = gpu_model_dir(arch)
    hf = hf_reference(path)
    # a small KV cache: the engines of earlier cases in this process may still hold theirs
    llm = LLM(
        path, attention_backend="TRITON_ATTN", dtype=dtype, block_size=16, max_model_len=256, kv_cache_memory=64 << 20
    )
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=0))
    for prompt, out in zip(PROMPTS, outs):
        ref_tokens, ref_logits = hf_greedy(hf, prompt, 16)
        tokens = out.outputs[0].token_ids
        if dtype == "float32":
            assert tokens == ref_tokens, f"{arch} {dtype}: {tokens} != {ref_tokens}"
        else:
            assert tokens[0] == ref_tokens[0]
    # prompt logits through the runner
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    prompt = PROMPTS[0]
    reqs = [ScheduledRequest("l", prompt, 0, list(range(-(-len(prompt) // 16))), SamplingParams(max_tokens=1), True)]
    llm.reset_prefix_cache()
    logits = llm.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0].float().cpu()
    ref = hf_greedy(hf, prompt, 0)[1]
    rel = (logits - ref).abs().max().item() / ref.abs().max().item()
    assert rel <= REL_TOL[dtype], f"{arch} {dtype}: relative logits error {rel:.3g}"
