"""How the engine's process reads a failing tensor-parallel rank (``executor/multiproc.py``), with real spawned
processes and pipes: a rank that sent its error is named by that error, even when its exit then aborts (seen on
CI: gloo's threads aborted a rank's exit after it sent a ConfigError, and the engine reported a crash)."""

from __future__ import annotations

import os

import pytest
import torch.multiprocessing as mp

from attnserve.config.fields import ConfigError
from attnserve.executor.base import WorkerConfigError
from attnserve.executor.multiproc import MultiprocExecutor
from attnserve.refusals import Refusal


def _refuse_then_abort(conn) -> None:
    """A rank whose construction refuses a setting: it sends the error, as ``run_worker`` does, then aborts."""
    from attnserve.executor.worker import _error

    try:
        raise ConfigError(Refusal(path=("kv_cache_memory",), value=10, reason="holds no block"))
    except ConfigError:
        conn.send(_error())
    os.abort()


def _executor_of(procs, conns) -> MultiprocExecutor:
    """The executor's failure handling over processes it did not start (its constructor spawns model workers)."""
    ex = object.__new__(MultiprocExecutor)
    ex.procs, ex.conns, ex.failed = procs, conns, None
    return ex


def test_a_rank_that_sent_its_error_is_named_by_it_though_its_exit_aborts():
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_refuse_then_abort, args=(theirs,))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -6  # SIGABRT, after the error was sent
    with pytest.raises(WorkerConfigError) as caught:
        _executor_of([proc], [ours])._wait({0})
    assert caught.value.refusal.path == ("kv_cache_memory",) and caught.value.refusal.value == 10
