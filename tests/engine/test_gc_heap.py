"""frozen_heap: the live objects in the permanent generation for the block, returned to the collector after it."""

import gc

import pytest

from attnserve.engine.gc_heap import frozen_heap


def test_frozen_inside_thawed_after():
    keep = [object() for _ in range(10)]
    with frozen_heap():
        assert gc.get_freeze_count() >= len(keep)
    assert gc.get_freeze_count() == 0


def test_thawed_after_an_error():
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("inside the timed loop")
    assert gc.get_freeze_count() == 0
