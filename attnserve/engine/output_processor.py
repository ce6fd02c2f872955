"""OutputProcessor: turns requests with new tokens into RequestOutputs (detokenized text, logprobs,
stop strings), grouping the ``n`` child requests of one prompt."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.engine.detokenizer import IncrementalDetokenizer
from attnserve.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from attnserve.engine.request import FinishReason, Request
from attnserve.core.sampling_params import SamplingParams


@dataclass
class _Child:
    request: Request
    completion: CompletionOutput
    detokenizer: IncrementalDetokenizer | None  # None: detokenize=False
    # with stop strings: the text so far, of which ``completion.text`` holds back the last
    # len(longest stop) - 1 characters while the request runs (they may begin a stop string)
    text: str = ""


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[_Child]
    metrics: RequestMetrics
    num_unfinished: int  # children whose completion has no finish_reason yet
    # with prompt_logprobs: [None, {token_id: Logprob} per later prompt token], once all are computed
    prompt_logprobs: list | None = None
    final_only: bool = False  # an output only when the request finishes (vLLM's FINAL_ONLY output kind)

    @property
    def finished(self) -> bool:
        return self.num_unfinished == 0

    @property
    def num_preemptions(self) -> int:
        kids = self.children
        return kids[0].request.num_preemptions if len(kids) == 1 else sum(k.request.num_preemptions for k in kids)


class OutputProcessor:
    """Keeps per-request text state between steps and builds RequestOutputs."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, _Parent] = {}
        self.child_to_parent: dict[str, tuple[_Parent, _Child]] = {}

    def add(
        self,
        request_id: str,
        prompt: str | None,
        prompt_ids: list[int],
        params: SamplingParams,
        children: list[Request],
        final_only: bool = False,
    ) -> None:
        """Track a request's ``children`` (its ``n`` completions). ``final_only``: :meth:`process` gives its output
        only once it has finished (vLLM's ``RequestOutputKind.FINAL_ONLY``, which its ``LLM.generate`` uses): no
        RequestOutput is built for it in the steps before."""
        kids = [
            _Child(
                request=r,
                completion=CompletionOutput(
                    index=i,
                    text="",
                    token_ids=[],
                    logprobs=[] if params.logprobs is not None else None,
                    cumulative_logprob=0.0 if params.logprobs is not None else None,
                ),
                detokenizer=IncrementalDetokenizer(
                    self.tokenizer, prompt_ids, params.skip_special_tokens, params.spaces_between_special_tokens
                )
                if params.detokenize
                else None,
            )
            for i, r in enumerate(children)
        ]
        parent = _Parent(
            request_id,
            prompt,
            prompt_ids,
            kids,
            RequestMetrics(arrival_time=children[0].arrival_time),
            len(kids),
            final_only=final_only,
        )
        self.parents[request_id] = parent
        for kid in kids:
            self.child_to_parent[kid.request.request_id] = (parent, kid)

    def child_ids(self, request_id: str) -> list[str]:
        parent = self.parents.get(request_id)
        return [] if parent is None else [c.request.request_id for c in parent.children]

    def abort(self, request_id: str) -> RequestOutput | None:
        """End an unfinished request (its children are already finished in the scheduler): every completion
        still running gets finish_reason "abort" and keeps its text so far, with what was held back
        released (a partial character, the start of a possible stop string). Returns that final output and
        forgets the request; None for an unknown or finished id."""
        parent = self.parents.get(request_id)
        if parent is None:
            return None
        for kid in parent.children:
            c = kid.completion
            if c.finish_reason is not None:  # a sibling (n > 1) that ended before
                continue
            tail = kid.detokenizer.flush() if kid.detokenizer is not None else ""
            text = (kid.text if _holds_back(kid.request.sampling_params) else c.text) + tail
            c.text_delta, c.num_new_tokens, c.text = text[len(c.text) :], 0, text
            c.finish_reason, c.stop_reason = FinishReason.ABORT.value, None
            parent.num_unfinished -= 1
        return self._output(parent)

    def _forget(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        for kid in parent.children if parent else []:
            self.child_to_parent.pop(kid.request.request_id, None)

    def process(self, updated: list[Request]) -> tuple[list[RequestOutput], list[tuple[str, str]]]:
        """Detokenize each request's new token; returns the outputs and (child id, stop string) pairs
        of requests a stop string ended."""
        touched: dict[str, _Parent] = {}
        stopped: list[tuple[str, str]] = []
        for req in updated:
            entry = self.child_to_parent.get(req.request_id)
            if entry is None:
                continue
            parent, kid = entry
            running = kid.completion.finish_reason is None
            stop = self._advance(kid, req)
            if stop is not None:
                stopped.append((req.request_id, stop))
            if running and kid.completion.finish_reason is not None:
                parent.num_unfinished -= 1
            touched[parent.request_id] = parent
        outputs = [self._output(parent) for parent in touched.values() if parent.finished or not parent.final_only]
        return outputs, stopped

    def _output(self, parent: _Parent) -> RequestOutput:
        """The parent's RequestOutput now (its completions' token lists are shared: see CompletionOutput)."""
        metrics = parent.metrics
        if metrics.first_token_time is None:  # set once: the first child's first token is the earliest
            first = [k.request.first_token_time for k in parent.children if k.request.first_token_time is not None]
            metrics.first_token_time = min(first) if first else None
        finished = parent.finished
        first = parent.children[0].request
        if (
            parent.prompt_logprobs is None
            and first.sampling_params.prompt_logprobs is not None
            and (len(first.prompt_logprobs) == len(parent.prompt_token_ids) - 1)
        ):
            detok = first.sampling_params.detokenize
            parent.prompt_logprobs = [None] + [
                self._logprobs(e, t, detok) for e, t in zip(first.prompt_logprobs, parent.prompt_token_ids[1:])
            ]
        if finished:
            metrics.finished_time = max(k.request.finished_time or 0.0 for k in parent.children)
            self._forget(parent.request_id)
        return RequestOutput(
            parent.request_id,
            parent.prompt,
            parent.prompt_token_ids,
            [_snapshot(k.completion) for k in parent.children],
            finished,
            RequestMetrics(metrics.arrival_time, metrics.first_token_time, metrics.finished_time),
            parent.num_preemptions,
            num_cached_tokens=parent.children[0].request.num_cached_tokens or 0,
            prompt_logprobs=parent.prompt_logprobs,
        )

    def _advance(self, kid: _Child, req: Request) -> str | None:
        c = kid.completion
        token_id = req.output_token_ids[-1]
        c.token_ids.append(token_id)
        c.num_new_tokens = 1
        if c.logprobs is not None and req.output_logprobs:
            entry = req.output_logprobs[-1]
            c.logprobs.append(self._logprobs(entry, token_id, kid.detokenizer is not None))
            c.cumulative_logprob += entry[0]
        ended = req.is_finished
        if kid.detokenizer is None:  # token ids only: no text, so no stop strings (SamplingParams checks)
            if ended:
                c.finish_reason, c.stop_reason = req.finish_reason.value, req.stop_reason
            return None
        p = req.sampling_params
        # EOS or a stop token id ended it: not in the text unless include_stop_str_in_output (vLLM)
        hide = (
            ended
            and req.finish_reason == FinishReason.STOP
            and not isinstance(req.stop_reason, str)
            and not p.include_stop_str_in_output
        )
        delta = "" if hide else kid.detokenizer.step([token_id])
        if ended:
            delta += kid.detokenizer.flush() if not hide else ""
        if not _holds_back(p):  # nothing to search: append the delta
            if ended:
                c.finish_reason, c.stop_reason = req.finish_reason.value, req.stop_reason
            c.text_delta = delta
            if delta:
                c.text += delta
            return None
        stop_string, stop_at = None, -1
        old_len = len(kid.text)
        text = kid.text + delta
        # vLLM: stop strings are looked for once the output has more than min_tokens tokens, and only where the
        # new text completes a match: an occurrence written earlier (inside min_tokens) neither stops nor cuts
        for s in p.stop if len(req.output_token_ids) > p.min_tokens else ():
            idx = text.find(s, max(0, old_len - len(s) + 1))
            if idx != -1 and (stop_string is None or idx < stop_at):
                stop_string, stop_at = s, idx
        if stop_string is not None:
            text = text[: stop_at + (len(stop_string) if p.include_stop_str_in_output else 0)]
            c.finish_reason, c.stop_reason = FinishReason.STOP.value, stop_string
        elif ended:
            c.finish_reason = req.finish_reason.value
            c.stop_reason = req.stop_reason
        kid.text = text
        # while running, hold back what a later token could turn into a stop string (streams must not send
        # text that the stop string then removes); the held-back characters never precede a match found later
        hold = 0 if c.finish_reason is not None or p.include_stop_str_in_output else max(len(s) for s in p.stop) - 1
        shown = text[: max(0, len(text) - hold)]
        c.text_delta = shown[len(c.text) :]
        c.text = shown
        return stop_string

    def _logprobs(self, entry, token_id: int, detokenize: bool) -> dict[int, Logprob]:
        sampled_lp, rank, top = entry
        decode = self.tokenizer.decode if detokenize else lambda ids: None
        out = {token_id: Logprob(sampled_lp, rank, decode([token_id]))}
        for r, (tid, lp) in enumerate(top, start=1):
            if tid not in out:
                out[tid] = Logprob(lp, r, decode([tid]))
        return out


def _holds_back(p: SamplingParams) -> bool:
    """Whether the text is searched for stop strings (and its tail held back while the request runs)."""
    return bool(p.stop)


def _snapshot(c: CompletionOutput) -> CompletionOutput:
    # token_ids and logprobs are shared, not copied: a copy is O(length) per request per step (see
    # CompletionOutput); positional (CompletionOutput's field order): a few hundred of these per step
    return CompletionOutput(
        c.index,
        c.text,
        c.token_ids,
        c.finish_reason,
        c.stop_reason,
        c.logprobs,
        c.text_delta,
        c.num_new_tokens,
        c.cumulative_logprob,
    )
