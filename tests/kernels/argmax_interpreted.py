"""``triton_argmax.argmax`` under the Triton interpreter on CPU tensors: ``python -m
tests.kernels.argmax_interpreted IN OUT`` with ``TRITON_INTERPRET=1`` (a process of its own: the mode is
fixed when the kernel is decorated). IN holds ``{name: (B, V) tensor}``; OUT gets ``{name: [index tensor of
each of two calls]}`` (the second call checks that the split counters were left at zero)."""

from __future__ import annotations

import sys

import torch


def main(inp: str, out: str) -> None:
    import triton

    from attnserve.kernels.triton_argmax import argmax

    assert triton.knobs.runtime.interpret, "run with TRITON_INTERPRET=1"
    torch.save({name: [argmax(x), argmax(x)] for name, x in torch.load(inp).items()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
