"""StructuredOutputManager without a model: the bitmask's rows and width, batched token acceptance."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from attnserve.core.sampling_params import SamplingParams
from attnserve.core.step import ScheduledRequest, SchedulerOutput
from attnserve.core.structured_outputs import StructuredOutputsParams as S
from attnserve.structured_output.grammar_process import GrammarProcessError
from attnserve.structured_output.manager import StructuredOutputManager

pytest.importorskip("xgrammar")


def _allowed(words: np.ndarray) -> list[int]:
    return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")).tolist()


def test_bitmask_rows_cover_the_tokenizers_tokens_of_constrained_requests(default_tokenizer):
    tok = default_tokenizer
    manager = StructuredOutputManager(tok, 151936, tok.eos_token_id)  # a model vocabulary padded past the tokenizer
    manager.add("a", S(regex="ab"))
    manager.add("c", S(choice=["x", "y"]))
    sched = SchedulerOutput(
        [
            ScheduledRequest(rid, [1], 0, [0], SamplingParams(), samples)
            for rid, samples in [("a", True), ("free", True), ("partial", False), ("c", True)]
        ]
    )
    mask = manager.bitmask(sched)
    assert mask.num_tokens == len(tok) and mask.words.shape == (2, len(tok) // 32) and mask.rows.tolist() == [0, 2]
    a, b, x, y = tok.convert_tokens_to_ids(["a", "b", "x", "y"])
    assert a in _allowed(mask.words[0]) and b not in _allowed(mask.words[0])
    assert {x, y} <= set(_allowed(mask.words[1])) and a not in _allowed(mask.words[1])
    # one batched accept: a grammar ends when its stop token is accepted, or when a token is rejected
    assert manager.accept_tokens([("a", a), ("free", 5), ("c", x)]) == []
    assert manager.accept_tokens([("a", b), ("c", y)]) == ["c"]  # "xy" is no choice
    assert manager.accept_tokens([("a", tok.eos_token_id)]) == ["a"]
    only_free = SchedulerOutput([ScheduledRequest("free", [1], 0, [0], SamplingParams(), True)])
    assert manager.bitmask(only_free) is None


def test_deferred_accepts_run_before_the_next_fill(default_tokenizer):
    tok = default_tokenizer
    manager = StructuredOutputManager(tok, len(tok), tok.eos_token_id)
    manager.add("a", S(regex="ab"))
    manager.add("c", S(choice=["x", "y"]))
    sched = SchedulerOutput([ScheduledRequest(rid, [1], 0, [0], SamplingParams(), True) for rid in ("a", "c")])
    a, b, x = tok.convert_tokens_to_ids(["a", "b", "x"])
    assert manager.accept_tokens([("a", a), ("c", x)], defer=True) == []  # nothing ends: accepted later
    mask = manager.start_bitmask(sched).result()  # the worker accepted them before it filled
    assert b in _allowed(mask.words[0]) and a not in _allowed(mask.words[0])
    assert _allowed(mask.words[1]) == [tok.eos_token_id]  # "x" is a whole choice
    assert manager.take_ended() == []
    assert manager.accept_tokens([("a", x)], defer=True) == []  # rejected ("ab" goes on with "b"), seen later
    manager.start_bitmask(sched).result()
    assert manager.take_ended() == ["a"] and manager.take_ended() == []
    assert manager.accept_tokens([("c", tok.eos_token_id)], defer=True) == ["c"]  # a stop token: at once


def _fill_once(manager):
    manager.add("a", S(regex="ab"))
    sched = SchedulerOutput([ScheduledRequest("a", [1], 0, [0], SamplingParams(), True)])
    manager.start_bitmask(sched).result()
    return manager._process._proc


def test_close_ends_the_grammar_process_and_a_later_add_starts_another(default_tokenizer):
    tok = default_tokenizer
    manager = StructuredOutputManager(tok, len(tok), tok.eos_token_id)
    first = _fill_once(manager)
    manager.close()
    assert first.poll() == 0
    second = _fill_once(manager)
    assert second.pid != first.pid and second.poll() is None
    manager.close()
    assert second.poll() == 0


def test_a_dropped_manager_ends_its_grammar_process(default_tokenizer):
    tok = default_tokenizer
    manager = StructuredOutputManager(tok, len(tok), tok.eos_token_id)
    proc = _fill_once(manager)
    del manager
    gc.collect()
    assert proc.wait(timeout=10) == 0


def test_a_step_of_more_constrained_rows_than_the_buffers_hold_is_an_error(default_tokenizer):
    tok = default_tokenizer
    manager = StructuredOutputManager(tok, len(tok), tok.eos_token_id, max_rows=2)
    for rid in "abc":
        manager.add(rid, S(regex="ab"))
    sched = SchedulerOutput([ScheduledRequest(rid, [1], 0, [0], SamplingParams(), True) for rid in "abc"])
    with pytest.raises(GrammarProcessError, match="3 constrained rows in a step, buffers of 2"):
        manager.start_bitmask(sched)
    manager.close()


def test_a_removed_requests_deferred_token_does_not_reach_the_next_request_in_its_slot(default_tokenizer):
    tok = default_tokenizer
    manager = StructuredOutputManager(tok, len(tok), tok.eos_token_id)
    manager.add("a", S(regex="ab"))
    a, b, x = tok.convert_tokens_to_ids(["a", "b", "x"])
    assert manager.accept_tokens([("a", x)], defer=True) == []  # "x" would end "a" (rejected)
    manager.remove("a")
    manager.add("c", S(regex="ab"))  # takes a's slot
    assert manager.matchers["c"] == 0
    sched = SchedulerOutput([ScheduledRequest("c", [1], 0, [0], SamplingParams(), True)])
    mask = manager.start_bitmask(sched).result()
    assert manager.take_ended() == [] and a in _allowed(mask.words[0]) and b not in _allowed(mask.words[0])
    manager.close()
