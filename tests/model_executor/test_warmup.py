"""The start-up mixed steps (``model_executor/warmup.py``): their shapes, and one run through a CPU runner."""

from __future__ import annotations

from attnserve.model_executor.forward_batch import host_batch
from attnserve.model_executor.warmup import warm_up_mixed_steps, warmup_steps


def test_two_mixed_steps_most_decodes_then_one():
    many, one = warmup_steps(max_num_seqs=256, max_num_batched_tokens=16384, max_model_len=2304, block_size=16)
    for reqs, decodes in ((many, 255), (one, 1)):
        h = host_batch(type("S", (), {"requests": reqs})(), block_size=16)
        assert (h.num_decodes, h.num_reqs, h.num_tokens) == (decodes, decodes + 1, decodes + 16)
        assert h.seq_lens.tolist() == [1025] * decodes + [16]
        assert h.block_table.shape == (decodes + 1, 80) and not h.block_table.any()  # 65 blocks, all block 0
        assert h.slot_mapping[:decodes].tolist() == [0 * 16 + 1024 % 16] * decodes


def test_small_budgets_shrink_or_drop_the_steps():
    (reqs,) = warmup_steps(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=100, block_size=16)
    assert [(r.start_position, len(r.token_ids), len(r.block_table)) for r in reqs] == [(99, 1, 7), (0, 16, 1)]
    many, _ = warmup_steps(max_num_seqs=256, max_num_batched_tokens=40, max_model_len=2304, block_size=16)
    assert len(many) == 25  # 24 decodes fill the budget with the 16 prompt tokens
    assert warmup_steps(max_num_seqs=1, max_num_batched_tokens=2048, max_model_len=2048, block_size=16) == []


def test_runs_through_a_runner_and_changes_no_output(tiny_model_dir):
    """Its K/V garbage in block 0 is overwritten by the next owner before anything reads it."""
    from attnserve import LLM, SamplingParams

    llm = LLM(
        tiny_model_dir("llama"),
        dtype="float32",
        device="cpu",
        kv_cache_memory=1 << 20,
        max_num_seqs=8,
        enable_prefix_caching=False,  # the second prompt computed again, over blocks the warm-up wrote
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    first = llm.generate(["hello there"], params)[0].outputs[0].token_ids
    runner = llm.engine.runner
    rows = dict(runner.block_table_rows._entries)
    assert warm_up_mixed_steps(runner) > 0
    assert runner.block_table_rows._entries == rows  # the warm-up's rows freed
    assert llm.generate(["hello there"], params)[0].outputs[0].token_ids == first
