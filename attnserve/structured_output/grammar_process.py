"""GrammarProcess: the grammar matchers of an engine's constrained requests, in a process of their own.

A step's grammar work (advance each matcher by its token, fill the next token bitmask: ~0.3 ms for 64 rows under a
JSON schema) runs while the engine's thread makes the outputs of the step before and plans the step after. In a
thread of the engine's process it slowed that Python by its own length: xgrammar's calls take the GIL back often
enough that a Python thread beside a fill ran at 39% of its speed and the fill at 55% of its own (measured on the
CPU, ``docs/benchmarks.md``), while a process beside it slowed neither. So the matchers live in a child process
(started with ``python -m``, never by re-running the user's ``__main__``): the engine sends it small messages over a
socket pair and the child writes each bitmask straight into shared memory, two buffers of ``(rows, width)`` int32
used in turn (pinned for the GPU copy where the engine copies to a GPU). Compiled grammars and the tokenizer's
vocabulary reach the child as files (xgrammar's JSON serialization), so no large message blocks the engine.

Messages (pickled tuples; one reply outstanding at a time): ``("grammar", key, path)`` a compiled grammar, ``("add",
slot, key)`` a fresh matcher in ``slot``, ``("remove", slot)``, ``("accept", slots, tokens)`` and ``("fill", slots,
tokens, fill_slots, turn)``: advance ``slots[i]`` by ``tokens[i]``, then (fill) fill row i of buffer ``turn`` for
``fill_slots[i]``; both reply ``("ok", ended)``, the positions among ``slots`` whose matcher rejected its token or
terminated, or ``("error", text)``.
"""

from __future__ import annotations

import mmap
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection

import numpy as np


class GrammarProcessError(RuntimeError):
    """The grammar process failed a request, or ended."""


class GrammarProcess:
    """The parent's end: the child process, its socket and the shared bitmask buffers.

    ``info_json``: the tokenizer's ``xgrammar.TokenizerInfo.serialize_json()``; ``rows``: the most constrained
    sampling rows of a step; ``width``: int32 words a row (``ceil(num_tokens / 32)``); ``pin``: register the buffers
    with CUDA (page-locked: the runner's non-blocking copy then does not wait)."""

    def __init__(self, info_json: str, rows: int, width: int, pin: bool = False) -> None:
        self.rows = rows
        self._dir = tempfile.mkdtemp(prefix="attnserve-grammar-")
        info_path = self._file("tokenizer_info.json", info_json)
        size = 2 * rows * width * 4
        if hasattr(os, "memfd_create"):  # Linux: memory without a file
            mem_fd = os.memfd_create("attnserve-grammar-bitmask")
        else:  # a file in the private folder, removed by close()
            mem_fd = os.open(os.path.join(self._dir, "bitmask"), os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(mem_fd, size)
        self._mm = mmap.mmap(mem_fd, size)
        # (2, rows, width) int32: buffer ``turn`` holds a step's bitmask while the other is filled for the next
        self.buffers = np.frombuffer(self._mm, dtype=np.int32).reshape(2, rows, width)
        self.pinned = _pinned_view(self.buffers) if pin else None
        parent, child = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        argv = [sys.executable, "-m", __name__, str(child.fileno()), str(mem_fd), str(rows), str(width), info_path]
        try:
            self._proc = subprocess.Popen(argv, pass_fds=(child.fileno(), mem_fd), env=env)
        finally:
            child.close()
            os.close(mem_fd)
        self._conn = Connection(parent.detach())
        self._waiting = False  # a reply is outstanding
        self._count = 0

    def _file(self, name: str, text: str) -> str:
        path = os.path.join(self._dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def grammar(self, key: int, compiled) -> None:
        """Send an ``xgrammar.CompiledGrammar`` under ``key`` (once per key)."""
        self._count += 1
        self._send(("grammar", key, self._file(f"grammar_{self._count}.json", compiled.serialize_json())))

    def add(self, slot: int, key: int) -> None:
        """A fresh matcher of grammar ``key`` in ``slot`` (replacing any there)."""
        self._send(("add", slot, key))

    def remove(self, slot: int) -> None:
        self._send(("remove", slot))

    def accept(self, slots: list[int], tokens: list[int]) -> list[int]:
        """Advance ``slots[i]`` by ``tokens[i]``, in order; the positions whose matcher rejected its token or
        terminated (accepted a stop token)."""
        self._send(("accept", slots, tokens))
        self._waiting = True
        return self.wait()

    def start_fill(self, slots: list[int], tokens: list[int], fill_slots: list[int], turn: int) -> None:
        """:meth:`accept`, then rows ``[0, len(fill_slots))`` of ``buffers[turn]`` filled with ``fill_slots``'
        next-token bitmasks, in the child; :meth:`wait` gives the accept's positions once both are done."""
        if len(fill_slots) > self.rows:
            raise GrammarProcessError(f"{len(fill_slots)} constrained rows in a step, buffers of {self.rows}")
        self._send(("fill", slots, tokens, fill_slots, turn))
        self._waiting = True

    def wait(self) -> list[int]:
        """The outstanding reply (at once: [] when none); GrammarProcessError for the child's error or its end."""
        if not self._waiting:
            return []
        self._waiting = False
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError):
            raise self._ended() from None
        if status != "ok":
            raise GrammarProcessError(value)
        return value

    def _send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except OSError:
            raise self._ended() from None

    def _ended(self) -> GrammarProcessError:
        return GrammarProcessError(f"the grammar process ended (exit code {self._proc.poll()})")

    def close(self) -> None:
        """End the child (it exits when its socket closes) and release the buffers and files."""
        if self._conn is None:
            return
        self._conn.close()
        self._conn = None
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self.pinned is not None:
            _unpin(self.buffers)
            self.pinned = None
        shutil.rmtree(self._dir, ignore_errors=True)


def _pinned_view(buffers: np.ndarray):
    """``buffers`` page-locked for CUDA, as a torch tensor over the same memory; None where CUDA refuses."""
    import torch

    err = int(torch.cuda.cudart().cudaHostRegister(buffers.ctypes.data, buffers.nbytes, 0))
    return torch.from_numpy(buffers) if err == 0 else None


def _unpin(buffers: np.ndarray) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(buffers.ctypes.data)


def serve(sock_fd: int, mem_fd: int, rows: int, width: int, info_path: str) -> None:
    """The child's loop: answer the parent's messages (module docstring) until its socket closes."""
    import xgrammar as xgr

    from attnserve.structured_output.backend_xgrammar import batch_accept

    conn = Connection(sock_fd)
    buffers = np.frombuffer(mmap.mmap(mem_fd, 2 * rows * width * 4), dtype=np.int32).reshape(2, rows, width)
    os.close(mem_fd)
    with open(info_path) as f:
        info = xgr.TokenizerInfo.deserialize_json(f.read())
    stop = frozenset(info.stop_token_ids)
    filler = xgr.BatchGrammarMatcher(max_threads=1)
    grammars: dict[int, object] = {}
    matchers: dict[int, object] = {}
    failed: str | None = None  # a grammar or matcher that could not be made: said in the next reply
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        op = msg[0]
        try:
            if op == "grammar":
                _, key, path = msg
                with open(path) as f:
                    grammars[key] = xgr.CompiledGrammar.deserialize_json(f.read(), info)
                os.unlink(path)
            elif op == "add":
                matchers[msg[1]] = xgr.GrammarMatcher(grammars[msg[2]])
            elif op == "remove":
                matchers.pop(msg[1], None)
            else:  # accept, fill
                if failed is not None:
                    raise GrammarProcessError(failed)
                slots, tokens = msg[1], msg[2]
                ended = batch_accept(xgr, [matchers[s] for s in slots], tokens, stop) if slots else []
                if op == "fill":
                    fill_slots, turn = msg[3], msg[4]
                    filler.batch_fill_next_token_bitmask(
                        [matchers[s] for s in fill_slots], buffers[turn, : len(fill_slots)]
                    )
                conn.send(("ok", ended))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
            text = f"{op}: {type(e).__name__}: {e}"
            if op in ("accept", "fill"):
                failed = None
                conn.send(("error", text))
            else:
                failed = text


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
