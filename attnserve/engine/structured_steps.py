"""StructuredSteps: the engine's step while a constrained request (structured outputs) runs, and the grammar
matchers' bookkeeping around it.

A step's grammar bitmask needs the tokens of the step before (a matcher must hold every token of its request
first). With async scheduling in one process (:meth:`StructuredSteps.step_async`) step k+1's forward pass is
queued first, then step k is read (its tokens advance the grammar matchers), step k+1's bitmask filled and then
its sampling queued (vLLM's order). The matchers' accepts of step k's tokens (all but stop tokens, accepted
now) and the fill run in the grammar process (``structured_output/grammar_process.py``); meanwhile the engine's thread
makes step k's outputs and schedules step k+2 on the host while the device runs the forward pass. The matchers
stay as they are until the fill is read. Step k+2's forward pass can only follow step k+1's sampling (its
inputs are those tokens): scheduled ahead, its plan and host batch (``ModelRunner.prepare_ahead``) are ready
then (requests added meanwhile wait for the step after it; aborted ones leave it,
:meth:`StructuredSteps.take_scheduled_ahead`).

A deferred token that ended its grammar (only a rejected one: a bug or a token nothing masked) is known only
after step k's outputs were made: its request ends with its next token, whose output then carries the finish
(finishing it earlier would leave no output to say so).

With worker processes, or without async scheduling, steps do not overlap (:meth:`StructuredSteps.step`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

from attnserve.core.step import SchedulerOutput
from attnserve.engine.outputs import RequestOutput
from attnserve.engine.request import FinishReason, Request
from attnserve.executor.base import WorkerDiedError

if TYPE_CHECKING:
    from attnserve.engine.llm_engine import LLMEngine


class StructuredSteps:
    """The structured-output step paths of one engine: they share its step pieces (``_schedule``, ``_update``,
    ``_outputs``, ``_finish``) and its step in flight (``_in_flight``)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        # the next step's plan, made early by :meth:`step_async`
        self.scheduled_ahead: SchedulerOutput | None = None
        # requests whose grammar a deferred token ended (:meth:`step_async`): they end with their next token
        self.ended_late: set[str] = set()

    def take_scheduled_ahead(self) -> SchedulerOutput | None:
        """The plan scheduled ahead (taken), less the requests aborted since; None when there is none."""
        sched, self.scheduled_ahead = self.scheduled_ahead, None
        if sched is None:
            return None
        live = self.engine.scheduler.requests
        if any(r.request_id not in live for r in sched.requests):  # a new plan: its host batch is made anew
            sched = dataclasses.replace(sched, requests=[r for r in sched.requests if r.request_id in live])
        return sched

    def step_async(self) -> list[RequestOutput]:
        """One async step k+1 with constrained requests: queue its forward pass, read step k, fill step k+1's
        bitmask in the grammar process beside step k's outputs and step k+2's plan, then queue step k+1's
        sampling (the module docstring has the order)."""
        engine = self.engine
        sched = engine._schedule()
        fill = None
        try:
            forward = engine.executor.queue_forward(sched)
            previous, engine._in_flight = engine._in_flight, None
            updated = engine._update(*previous, defer_accept=True) if previous is not None else []
            # the deferred accepts and the fill, in the grammar process: the matchers stay as they are until it is read
            fill = engine.structured.start_bitmask(sched)
            outputs = engine._outputs(updated)
            if not sched.is_empty and engine.structured.has_unfinished(engine.scheduler.requests):
                self.scheduled_ahead = engine.scheduler.schedule()
                if engine.runner is not None:  # its host batch too (numpy): only the launch waits for the sampling
                    engine.runner.prepare_ahead(self.scheduled_ahead)
            sched.grammar_bitmask = fill.result()
            # a deferred token that ended its grammar is known only now: its request ends with its next token
            self.ended_late.update(engine.structured.take_ended())
            self.remove_finished_matchers(updated)
            queued = forward.sample(sched.grammar_bitmask)
            if not sched.is_empty:
                engine._in_flight = (sched, queued)
            return outputs
        except BaseException:
            engine._in_flight = self.scheduled_ahead = None
            engine.block_manager.reset_prefix_cache()
            if fill is not None:  # the grammar process's reply read: the next request to it finds none outstanding
                with contextlib.suppress(Exception):
                    fill.result()
            raise

    def step(self) -> list[RequestOutput]:
        """One step without overlap: read the step in flight (its tokens advance the grammar matchers), then
        schedule, fill the grammar bitmask on the host and run the step to completion."""
        engine = self.engine
        previous, engine._in_flight = engine._in_flight, None
        try:
            outputs = engine._finish(*previous) if previous is not None else []
            sched = engine._schedule()
            sched.grammar_bitmask = engine.structured.bitmask(sched)
            return outputs + engine._finish(sched, engine.executor.execute(sched))
        except WorkerDiedError:
            engine._fail_all()
            raise
        except BaseException:
            engine.block_manager.reset_prefix_cache()
            raise

    def advance_matchers(self, updated: list[Request], defer_accept: bool = False) -> None:
        """After a step's tokens are appended: finish the requests that :meth:`step_async` found ended late, then
        advance the grammar matchers by the new tokens (``defer_accept``: only by stop tokens now, the rest by the
        next bitmask fill: ``StructuredOutputManager.accept_tokens``)."""
        structured, scheduler = self.engine.structured, self.engine.scheduler
        if self.ended_late:
            self._finish_ended([r.request_id for r in updated if r.request_id in self.ended_late])
            self.ended_late.intersection_update(scheduler.requests)  # the others ended or left
        if structured.active:
            tokens = [(req.request_id, req.output_token_ids[-1]) for req in updated if not req.is_finished]
            self._finish_ended(structured.accept_tokens(tokens, defer=defer_accept))
            self.remove_finished_matchers(updated)  # a terminated matcher has no next bitmask to fill

    def _finish_ended(self, ended: list[str]) -> None:
        """Finish the requests whose grammar ended (terminated, or its token rejected): finish reason stop."""
        scheduler = self.engine.scheduler
        for rid in ended:
            req = scheduler.requests.get(rid)
            if req is not None and not req.is_finished:
                scheduler.finish_request(rid, FinishReason.STOP)

    def remove_finished_matchers(self, updated: list[Request]) -> None:
        """Drop the grammar matchers of the requests among ``updated`` that ended."""
        structured = self.engine.structured
        if structured.active:
            for req in updated:
                if req.is_finished:
                    structured.remove(req.request_id)
