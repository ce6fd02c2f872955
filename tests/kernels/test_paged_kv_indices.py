"""FlashInfer's paged-KV arrays (``indptr``, ``last_page_len``, page ids) built from seq_lens and a block table:
on the host (numpy), on the device in PyTorch, and by the Triton kernel the FLASHINFER backend captures in its
decode graphs, each against the definition. FlashInfer itself runs only on the GPU (tests/gpu)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from attnserve.kernels.paged_kv_indices import device_pages_torch, host_pages


# ------------------------------------------------------------------------------------------- page arrays
def _naive(seq_lens, table, page):
    pages = [(int(s) + page - 1) // page for s in seq_lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.array([int(s) - (p - 1) * page for s, p in zip(seq_lens, pages)], np.int32)
    indices = np.concatenate([np.asarray(table[i, :p]) for i, p in enumerate(pages)]).astype(np.int32)
    return indptr, last, indices


@pytest.mark.parametrize("n,width,page", [(1, 1, 16), (3, 8, 16), (64, 70, 16), (5, 4, 64), (300, 9, 16)])
def test_host_and_device_pages_match_the_definition(n, width, page):
    gen = torch.Generator().manual_seed(n)
    seq = torch.randint(1, width * page + 1, (n,), generator=gen, dtype=torch.int32)
    seq[0] = width * page  # a full last page and a full table row
    table = torch.randint(0, 10_000, (n, width), generator=gen, dtype=torch.int32)
    want_indptr, want_last, want_indices = _naive(seq, table, page)
    indptr, last = host_pages(seq.numpy(), page)
    assert (indptr == want_indptr).all() and (last == want_last).all()
    out_indptr, out_last = np.full(n + 5, -1, np.int32), np.full(n + 5, -1, np.int32)
    host_pages(seq.numpy(), page, out_indptr, out_last)  # into caller buffers (pinned views in the builder)
    assert (out_indptr[: n + 1] == want_indptr).all() and (out_last[:n] == want_last).all()
    d_indptr, d_last = torch.full((n + 3,), -7, dtype=torch.int32), torch.full((n + 2,), -7, dtype=torch.int32)
    d_indices = torch.full((n * width + 1,), -7, dtype=torch.int32)
    device_pages_torch(seq, table, page, d_indptr, d_last, d_indices)
    assert (d_indptr[: n + 1].numpy() == want_indptr).all() and (d_last[:n].numpy() == want_last).all()
    assert (d_indices[: want_indptr[-1]].numpy() == want_indices).all()


def test_triton_device_pages_in_interpreter(tmp_path):
    """The Triton kernel against the definition, under the Triton interpreter (a subprocess: the interpreter
    mode is fixed when Triton's kernels are decorated)."""
    pytest.importorskip("triton")
    import os
    import subprocess

    code = (
        "import numpy as np, torch\n"
        "from attnserve.kernels.triton_paged_kv_indices import device_pages_triton\n"
        "from attnserve.kernels.paged_kv_indices import device_pages_torch\n"
        "g = torch.Generator().manual_seed(0)\n"
        "for n, w, p in [(1, 1, 16), (3, 8, 16), (64, 70, 16), (5, 4, 64), (300, 9, 16), (2, 300, 16), (700, 3, 16)]:\n"
        "    seq = torch.randint(1, w * p + 1, (n,), generator=g, dtype=torch.int32)\n"
        "    table = torch.randint(0, 10000, (n, w), generator=g, dtype=torch.int32)\n"
        "    outs = []\n"
        "    for fn in (device_pages_torch, device_pages_triton):\n"
        "        a, b, c = (torch.full((k,), -7, dtype=torch.int32) for k in (n + 1, n, n * w + 1))\n"
        "        fn(seq, table, p, a, b, c)\n"
        "        outs.append((a, b, c[: int(a[-1])]))\n"
        "    assert all(torch.equal(x, y) for x, y in zip(*outs)), (n, w, p)\n"
        "print('ok')\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": root},
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
