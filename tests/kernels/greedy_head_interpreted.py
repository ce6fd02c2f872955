"""``triton_greedy_head.greedy_head`` under the Triton interpreter on CPU tensors: ``python -m
tests.kernels.greedy_head_interpreted IN OUT`` with ``TRITON_INTERPRET=1`` (a process of its own: the mode is fixed
when the kernels are decorated). IN holds ``{name: (hidden, weight, config fields or None[, mask_words, mask_index, mask_tokens])}``; OUT
gets ``{name: (tokens, tokens of the call that also stored its logits, those logits)}``, each call with the case's
grammar bitmask where it has one."""

from __future__ import annotations

import sys

import torch


def main(inp: str, out: str) -> None:
    import triton

    from attnserve.kernels.triton_greedy_head import GreedyHeadConfig, greedy_head

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    results = {}
    for name, (hidden, weight, fields, *mask) in torch.load(inp).items():
        cfg = GreedyHeadConfig(*fields) if fields else None
        masked = dict(zip(("mask_words", "mask_index", "mask_tokens"), mask))
        logits = torch.empty(hidden.shape[0], weight.shape[0], dtype=weight.dtype)
        results[name] = (
            greedy_head(hidden, weight, cfg, **masked),
            greedy_head(hidden, weight, cfg, logits_out=logits, **masked),
            logits,
        )
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
