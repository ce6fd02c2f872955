"""``gemv/blas.py`` without a GPU: the one-time silencing of torch's C++ warning hides only what is written to
file descriptor 2 inside it and restores the descriptor. (cuBLASLt itself, that it agrees with ``F.linear`` and
that the switch leaves torch's preference as it was: ``tests/gpu/test_skinny_gemm.py``.)"""

from __future__ import annotations

import os

from attnserve.gemv import blas


def test_stderr_silenced_hides_fd2_writes_inside_only(capfd):
    os.write(2, b"before\n")
    with blas._stderr_silenced():
        os.write(2, b"hidden\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\nafter\n"
