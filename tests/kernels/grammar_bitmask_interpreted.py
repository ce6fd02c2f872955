"""``triton_grammar_bitmask.apply_bitmask_inplace`` under the Triton interpreter on CPU tensors: ``python -m
tests.kernels.grammar_bitmask_interpreted IN OUT`` with ``TRITON_INTERPRET=1`` (a process of its own: the mode is
fixed when the kernel is decorated). IN holds ``{name: (logits, words, rows or None, num_tokens)}``; OUT gets
``{name: masked logits}``."""

from __future__ import annotations

import sys

import torch


def main(inp: str, out: str) -> None:
    import triton

    from attnserve.kernels.triton_grammar_bitmask import apply_bitmask_inplace

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    results = {}
    for name, (logits, words, rows, num_tokens) in torch.load(inp).items():
        results[name] = apply_bitmask_inplace(logits.clone(), words, rows, num_tokens)
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
