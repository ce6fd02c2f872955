"""``triton_fp8_decode.fp8_decode_attention`` and ``triton_attention.paged_attention`` (its unified fp8 path) under
the Triton interpreter on CPU tensors: ``python -m tests.kernels.fp8_decode_interpreted IN OUT`` with
``TRITON_INTERPRET=1``. IN holds ``{name: case}`` (``test_triton_fp8_decode.fp8_decode_case``'s tensors and
options); OUT gets ``{name: {"keys": output, "unified": output}}``."""

from __future__ import annotations

import sys

import torch


def run_case(case: dict) -> dict:
    from attnserve.kernels.attention_tiles import block_m_for, query_tiles
    from attnserve.kernels.triton_attention import paged_attention
    from attnserve.kernels.triton_fp8_decode import fp8_decode_attention

    q, kc, vc, table, seq_lens = (
        case["query"],
        case["key_cache"],
        case["value_cache"],
        case["block_table"],
        case["seq_lens"],
    )
    scale, ks, vs, splits = case["scale"], case["k_scale"], case["v_scale"], case["num_splits"]
    keys = fp8_decode_attention(
        torch.empty_like(q),
        q,
        kc,
        vc,
        table,
        seq_lens,
        scale,
        k_scale=ks,
        v_scale=vs,
        num_splits=splits,
        block_n=case["block_n"],
        pv=case["pv"],
    )
    batch = q.shape[0]
    qsl = torch.arange(batch + 1, dtype=torch.int32)
    tile_seq, tile_start = query_tiles(qsl, block_m_for(q.shape[1] // kc.shape[2])[1])
    unified = paged_attention(
        torch.empty_like(q),
        q,
        kc,
        vc,
        table,
        seq_lens,
        qsl,
        tile_seq,
        tile_start,
        scale,
        k_scale=ks,
        v_scale=vs,
        decode=True,
    )
    return {"keys": keys, "unified": unified}


def main(inp: str, out: str) -> None:
    import triton

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    torch.save({name: run_case(case) for name, case in torch.load(inp).items()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
