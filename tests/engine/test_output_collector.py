"""RequestOutputCollector: a reader that falls behind gets the newest output, the ones it missed merged, and the
engine's lists are copied only up to their lengths when each output was put."""

from __future__ import annotations

import asyncio

import pytest

from attnserve.engine.output_collector import RequestOutputCollector
from attnserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


def _output(text: str, token_ids: list[int], logprobs: list | None = None, finished: bool = False) -> RequestOutput:
    c = CompletionOutput(0, text, token_ids, "length" if finished else None, None, logprobs)
    return RequestOutput("r", None, [1, 2], [c], finished, RequestMetrics(0.0))


def test_pending_outputs_merge_into_one_with_their_delta():
    async def run():
        collector = RequestOutputCollector(asyncio.get_running_loop())
        ids, logprobs = [], []  # the engine's lists, shared by every output it puts
        for step, word in enumerate(["a", "b", "c"]):
            ids.append(step)
            logprobs.append({step: step})
            collector.put(_output("abc"[: step + 1], ids, logprobs))
        ids.append(99)  # the engine stepped on after the last put: not part of that output
        logprobs.append({99: 99})
        first = await collector.get()
        c = first.outputs[0]
        assert (c.text, c.token_ids, c.text_delta, c.num_new_tokens) == ("abc", [0, 1, 2], "abc", 3)
        assert c.logprobs == [{0: 0}, {1: 1}, {2: 2}] and c.token_ids is not ids
        collector.put(_output("abcd", ids, logprobs, finished=True))
        last = await collector.get()
        c = last.outputs[0]
        assert (c.text, c.token_ids, c.text_delta, c.num_new_tokens, last.finished) == (
            "abcd",
            [0, 1, 2, 99],
            "d",
            1,
            True,
        )

    asyncio.run(run())


def test_an_error_replaces_the_pending_output_and_stays():
    async def run():
        collector = RequestOutputCollector(asyncio.get_running_loop())
        collector.put(_output("a", [1]))
        collector.put(RuntimeError("engine died"))
        collector.put(_output("ab", [1, 2]))
        with pytest.raises(RuntimeError, match="engine died"):
            await collector.get()

    asyncio.run(run())


def test_a_put_from_another_thread_wakes_the_reader():
    async def run():
        collector = RequestOutputCollector(asyncio.get_running_loop())
        reader = asyncio.ensure_future(collector.get())
        await asyncio.sleep(0.01)
        await asyncio.to_thread(collector.put, _output("x", [7], finished=True))
        out = await asyncio.wait_for(reader, 5)
        assert out.outputs[0].token_ids == [7]

    asyncio.run(run())
