"""TRITON_ATTN's cascade step (``TritonAttentionImpl._cascade``: the prefix call, then the suffix call that folds its
partial results in, or a merge) against the plain-PyTorch oracle over each request's whole table, under the Triton
interpreter.

``python -m tests.kernels.cascade_interpreted IN OUT`` with ``TRITON_INTERPRET=1`` (``tests.helpers.
run_cases_in_triton_interpreter`` starts it): IN holds ``{name: case fields}``, OUT gets ``{name: {"cascade": ...,
"plain": ..., "ref": ..., "splits": ...}}``.
"""

from __future__ import annotations

import sys

import torch

from tests.kernels.triton_attention_interpreted import fix_interpreter_bf16_dot


def run(case: dict) -> dict:
    """One decode step of requests sharing ``prefix_blocks`` blocks and holding ``own`` tokens each after them."""
    from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata
    from attnserve.attention.backends.triton_attn import TritonAttentionBackend
    from attnserve.attention.cascade import CascadePrefix
    from attnserve.kernels.reference import reference_paged_attention

    dtype = getattr(torch, case["dtype"])
    hq, hkv, d, bs, prefix_blocks, own = case["hq"], case["hkv"], case["head"], 16, case["prefix_blocks"], case["own"]
    g = torch.Generator().manual_seed(0)
    b, prefix_len = len(own), prefix_blocks * bs
    seq_lens = torch.tensor([prefix_len + n + 1 for n in own])
    own_blocks = [-(-int(n - prefix_len) // bs) for n in seq_lens]
    num_blocks = prefix_blocks + sum(own_blocks) + 2
    table = torch.zeros(b, prefix_blocks + max(own_blocks), dtype=torch.int32)
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)  # physical blocks in no order
    table[:, :prefix_blocks] = perm[:prefix_blocks]
    at = prefix_blocks
    for i, n in enumerate(own_blocks):
        table[i, prefix_blocks : prefix_blocks + n] = perm[at : at + n]
        at += n
    kv = (torch.randn(num_blocks, 2, bs, hkv, d, generator=g) * 2).to(dtype)
    q, key, value = ((torch.randn(b, h, d, generator=g) * 2).to(dtype) for h in (hq, hkv, hkv))
    pos = seq_lens - 1
    slots = (table[torch.arange(b), pos // bs].long() * bs + pos % bs).long()
    qsl = torch.arange(b + 1, dtype=torch.int32)
    spec = AttentionLayerSpec(
        num_heads=hq, head_size=d, scale=d**-0.5, num_kv_heads=hkv, logits_soft_cap=case.get("softcap")
    )
    builder = TritonAttentionBackend.get_builder_cls()(spec, torch.device("cpu"), dtype)
    builder.num_sms = 132  # an H200's: the split counts a GPU would get
    impl = TritonAttentionBackend.get_impl_cls()(spec)
    sinks = torch.randn(hq, generator=g) if case.get("sinks") else None
    impl.sinks = sinks
    assert builder.supports_cascade

    def common(tab, lens, cascade=None):
        return CommonAttentionMetadata(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl,
            seq_lens=lens.to(torch.int32),
            seq_lens_cpu=lens.to(torch.int32),
            block_table=tab.contiguous(),
            slot_mapping=slots,
            num_reqs=b,
            num_actual_tokens=b,
            max_query_len=1,
            max_seq_len=int(lens.max()),
            num_decodes=b,
            num_decode_tokens=b,
            block_size=bs,
            cascade=cascade,
        )

    prefix = CascadePrefix(
        table[:1, :prefix_blocks].contiguous(),
        torch.tensor([prefix_len], dtype=torch.int32),
        torch.tensor([0, b], dtype=torch.int32),
        prefix_len,
    )
    plain = impl.forward(q.clone(), key, value, kv, builder.build(common(table, seq_lens)))
    metadata = builder.build(common(table[:, prefix_blocks:], seq_lens - prefix_len, prefix))
    cascade = impl.forward(q.clone(), key, value, kv, metadata)
    ref = reference_paged_attention(
        q.float(),
        kv.float().permute(1, 0, 2, 3, 4),
        qsl,
        seq_lens.to(torch.int32),
        table,
        d**-0.5,
        logits_soft_cap=case.get("softcap"),
        sinks=sinks,
    )
    return dict(
        cascade=cascade.float(),
        plain=plain.float(),
        ref=ref.float(),
        splits=[c.num_splits for c in metadata.calls],
        rows=[c.block_m for c in metadata.calls],
    )


def main(src: str, dst: str) -> None:
    fix_interpreter_bf16_dot()
    cases = torch.load(src)
    torch.save({name: run(case) for name, case in cases.items()}, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
