"""``triton_greedy_head.greedy_head`` under the Triton interpreter on CPU tensors: ``python -m
tests.kernels.greedy_head_interpreted IN OUT`` with ``TRITON_INTERPRET=1`` (a process of its own: the mode is fixed
when the kernels are decorated). IN holds ``{name: (hidden, weight, config fields or None)}``; OUT gets
``{name: (tokens, tokens of the call that also stored its logits, those logits)}``."""

from __future__ import annotations

import sys

import torch


def main(inp: str, out: str) -> None:
    import triton

    from attnserve.kernels.triton_greedy_head import GreedyHeadConfig, greedy_head

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    results = {}
    for name, (hidden, weight, fields) in torch.load(inp).items():
        cfg = GreedyHeadConfig(*fields) if fields else None
        logits = torch.empty(hidden.shape[0], weight.shape[0], dtype=weight.dtype)
        results[name] = (greedy_head(hidden, weight, cfg), greedy_head(hidden, weight, cfg, logits_out=logits), logits)
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
