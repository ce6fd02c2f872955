"""Incremental detokenization of a decode step, through the tokenizer's Python ``decode`` and through its Rust
decode (the fast path ``IncrementalDetokenizer`` takes where the two give the same text).

    PYTHONPATH=. python benchmarks/detokenizer_paths.py [--tokenizer DIR] [--clean-up] [--num-requests 64]

``--clean-up`` sets the tokenizer's ``clean_up_tokenization_spaces`` (a checkpoint such as Llama-3's sets it; a
folder saved without the key reads it as true in older transformers). Prints ms per step of ``--num-requests``
requests, each one token, for both paths, and which one the engine takes.
"""

from __future__ import annotations

import argparse
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the default model's)")
    ap.add_argument("--clean-up", action="store_true")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args()
    from attnserve.engine.detokenizer import IncrementalDetokenizer, backend_decode_is_exact

    if a.tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.tokenizer)
    else:
        from attnserve.model_executor.loader import load_tokenizer, resolve_model_source

        tok = load_tokenizer(resolve_model_source(None))
    tok.clean_up_tokenization_spaces = a.clean_up
    rng = random.Random(0)
    steps = [[rng.randrange(100, len(tok) - 100) for _ in range(a.num_requests)] for _ in range(a.steps)]

    def run(rust: bool) -> float:
        ds = [IncrementalDetokenizer(tok, [1, 2, 3], True) for _ in range(a.num_requests)]
        for d in ds:
            if not rust:
                d._backend_decode = None
        t = time.perf_counter()
        for step in steps:
            for d, token in zip(ds, step):
                d.step([token])
        return 1e3 * (time.perf_counter() - t) / len(steps)

    run(True)  # warm-up
    print(
        f"clean_up_tokenization_spaces {a.clean_up}; the engine takes the Rust decode: {backend_decode_is_exact(tok)}"
    )
    print(f"ms per step of {a.num_requests} requests: Python decode {run(False):.3f}, Rust decode {run(True):.3f}")


if __name__ == "__main__":
    main()
