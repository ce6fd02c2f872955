"""FillWorker: the grammar fill's thread hands jobs over and back by two locks."""

import threading

import pytest

from attnserve.structured_output.fill_worker import FillWorker


def test_runs_each_job_on_its_thread_in_turn():
    worker = FillWorker(name="test-fill")
    ran = []
    for i in range(3):
        worker.submit(lambda i=i: ran.append((i, threading.current_thread().name)))
        worker.wait()
    assert ran == [(0, "test-fill"), (1, "test-fill"), (2, "test-fill")]
    worker.close()


def test_wait_reraises_the_jobs_error_and_the_worker_goes_on():
    worker = FillWorker()

    def fail():
        raise ValueError("bad grammar state")

    worker.submit(fail)
    with pytest.raises(ValueError, match="bad grammar state"):
        worker.wait()
    worker.submit(lambda: None)
    worker.wait()  # nothing left over from the error
    worker.close()


def test_wait_without_a_job_returns_at_once():
    worker = FillWorker()
    worker.wait()
    worker.close()


def test_a_second_submit_before_wait_is_refused():
    worker = FillWorker()
    release = threading.Event()
    worker.submit(release.wait)
    with pytest.raises(RuntimeError, match="before wait"):
        worker.submit(lambda: None)
    release.set()
    worker.wait()
    worker.close()


def test_close_ends_the_thread_and_later_submits_are_refused():
    worker = FillWorker(name="test-fill-close")
    worker.submit(lambda: None)
    worker.close()  # waits for the job first
    assert "test-fill-close" not in {t.name for t in threading.enumerate()}
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit(lambda: None)
    worker.close()  # twice is harmless
