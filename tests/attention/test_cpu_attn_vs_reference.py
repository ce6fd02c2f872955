"""CPU_ATTN against the plain-PyTorch reference on a realistic paged cache (named batch shapes)."""

from __future__ import annotations

import pytest
import torch

from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata
from attnserve.attention.backends.cpu_attn import CPUAttentionBackend
from attnserve.kernels.reference import reference_paged_attention

# name -> (query lengths, context lengths after the step); decodes first, as the scheduler orders them
CASES = {
    "decode_only": ([1, 1, 1, 1], [1, 17, 40, 100]),
    "prefill_only": ([7, 33, 16], [7, 33, 16]),
    "mixed": ([1, 1, 12, 5], [9, 64, 12, 30]),  # the last one is a chunked prefill (25 cached + 5 new)
    "long_prompt": ([300], [300]),
}


def make_step(query_lens, seq_lens, block_size, num_blocks, gen):
    """Block tables in random order over a shared pool, slot mapping of each step token."""
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots = [], []
    for q_len, s_len in zip(query_lens, seq_lens):
        n = -(-s_len // block_size)
        table = [perm.pop() for _ in range(n)]
        tables.append(table)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(s_len - q_len, s_len)]
    width = max(len(t) for t in tables)
    block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qsl = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return block_table, qsl, torch.tensor(slots, dtype=torch.int64)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window", [None, 8])
@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
def test_cpu_attn_matches_reference(case, heads, block_size, window, sinks):
    gen = torch.Generator().manual_seed(0)
    query_lens, seq_lens = CASES[case]
    hq, hkv, d = *heads, 32
    num_blocks = sum(-(-s // block_size) for s in seq_lens) + 5
    block_table, qsl, slot_mapping = make_step(query_lens, seq_lens, block_size, num_blocks, gen)
    kv_cache = torch.randn(2, num_blocks, block_size, hkv, d, generator=gen)  # random "earlier" context
    t = sum(query_lens)
    q, k, v = (torch.randn(t, h, d, generator=gen) for h in (hq, hkv, hkv))
    spec = AttentionLayerSpec(num_heads=hq, head_size=d, scale=d**-0.5, num_kv_heads=hkv, sliding_window=window)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=seq,
        seq_lens_cpu=seq,
        block_table=block_table,
        slot_mapping=slot_mapping,
        num_reqs=len(seq_lens),
        num_actual_tokens=t,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        num_decodes=query_lens.count(1),
        num_decode_tokens=query_lens.count(1),
        block_size=block_size,
    )
    metadata = CPUAttentionBackend.get_builder_cls()(spec, torch.device("cpu"), torch.float32).build(common)
    cache_ours = kv_cache.clone()
    impl = CPUAttentionBackend.get_impl_cls()(spec)
    sink_logits = torch.randn(hq, generator=gen) * 2 if sinks else None  # gpt-oss: one learned logit per head
    if sinks:
        impl.use_sinks(sink_logits)
    out = impl.forward(q, k, v, cache_ours, metadata)
    # the reference reads a cache that already holds this step's K/V
    cache_ref = kv_cache.clone()
    flat = cache_ref.view(2, -1, hkv, d)
    flat[0, slot_mapping], flat[1, slot_mapping] = k, v
    assert torch.equal(cache_ours, cache_ref)  # K/V written to exactly the slots of the slot mapping
    ref = reference_paged_attention(
        q, cache_ref, qsl, seq, block_table, d**-0.5, sliding_window=window, sinks=sink_logits
    )
    assert not torch.isnan(out).any()
    assert (out - ref).abs().max().item() < 1e-5
    if sinks:  # guard: the sinks change the output
        plain = reference_paged_attention(q, cache_ref, qsl, seq, block_table, d**-0.5, sliding_window=window)
        assert (plain - ref).abs().max().item() > 1e-3
