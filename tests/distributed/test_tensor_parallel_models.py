"""Tensor parallelism of the Gemma and mixture-of-experts models on CPU (gloo): TP=2 gives exactly TP=1's and
transformers' greedy tokens (float32), with prompts and generations past the sliding window of 8.

- Gemma 2 / 3: each rank 2 of the 4 query heads and 1 of the 2 KV heads (head size 16 here; soft caps, q/k
  norms and RoPE act per head), half of the GeGLU columns; two layer groups (windowed, global) per rank.
- Qwen3-MoE (dense and sparse layers), Mixtral: every expert's intermediate dimension split over the ranks, one
  all-reduce after the experts (uneven splits: ``tests/kernels/test_moe.py``).
- gpt-oss with windowed and full layers alternating: the sinks narrowed to each rank's heads, the stacked expert
  tensors and their biases to each rank's columns (``w2``'s bias added on rank 0 only).
"""

from __future__ import annotations

import pytest
import torch

from attnserve import LLM, SamplingParams
from tests.helpers import hf_greedy

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(100, 137)), [42]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
ENGINE = dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=8 << 20)


def tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "qwen3_moe", "mixtral", "gpt_oss_mixed"])
def test_tp2_matches_tp1_and_transformers(arch, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir(arch)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    expected = [hf_greedy(hf, p, GREEDY.max_tokens)[0] for p in PROMPTS]
    assert tokens(LLM(path, **ENGINE)) == expected
    llm = LLM(path, tensor_parallel_size=2, **ENGINE)
    try:
        assert llm.engine.info.tensor_parallel_size == 2
        assert llm.engine.info.num_kv_heads == 1  # each rank caches one of the 2 KV heads
        assert tokens(llm) == expected
    finally:
        llm.engine.shutdown()


def test_gguf_tp2_matches_safetensors_tp1(default_tokenizer, tmp_path):
    """gpt-oss from a GGUF on 2 ranks: each rank narrows the dequantized tensors (the per-expert tensors of the
    stacked experts and their biases, the sinks) as from safetensors."""
    from tests.models.gguf_writer import write_gguf
    from tests.models.test_gguf_models import GGUF_CASES
    from tests.models.tiny import make_tiny_model

    gguf_arch, changes = GGUF_CASES["gpt_oss_mixed"]
    folder = make_tiny_model("gpt_oss_mixed", tmp_path / "st", default_tokenizer, **changes)
    path = write_gguf(folder, str(tmp_path / "tiny-gpt-oss-f32.gguf"), gguf_arch)
    reference = tokens(LLM(folder, **ENGINE))
    llm = LLM(path, tokenizer=folder, tensor_parallel_size=2, **ENGINE)
    try:
        assert tokens(llm) == reference
    finally:
        llm.engine.shutdown()
