"""Scheduler: continuous batching under a token budget, chunked prefill, preemption by recompute. No torch.

The scheduler speaks in tokens, not phases: each step every scheduled request computes up to
``num_tokens - num_computed_tokens`` of its tokens, which covers prefill, chunked prefill, recompute
after preemption and decode in one path (vLLM v1's scheduler). Running requests go first, in arrival
order; when blocks run out the most recently admitted running request is preempted: its blocks are
freed and it goes back to the front of the waiting queue to be recomputed later.

With prefix caching a request's admission starts it at the longest run of cached full blocks
(``BlockManager.lookup``), never past its last token, whose logits the step needs; the blocks a step
computes are registered for later requests as the step is scheduled. A preempted request's blocks stay
cached until evicted, so its recompute starts where they still are, and the ``n`` completions of a request
(queued one after another) find the first one's prompt blocks.

A step is accounted when it is scheduled (computed tokens advance, a sampling request gets a pending
token) and its sampled tokens are appended by :meth:`Scheduler.update` when they are read. With async
scheduling the engine schedules step k+1 before reading step k's tokens: a decode then feeds its pending
token as a placeholder the runner fills on the device, and a request whose pending token reaches its
length limit is not scheduled again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from attnserve.config.fields import ConfigError
from attnserve.engine.block_hash import PromptHashMemo, extend_block_hashes
from attnserve.refusals.capacity import prompt_exceeds_kv_cache, prompt_exceeds_step
from attnserve.engine.block_manager import BlockManager
from attnserve.core.step import PLACEHOLDER_TOKEN, ScheduledRequest, SchedulerOutput
from attnserve.engine.request import FinishReason, Request, RequestStatus


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since start, counted at admission (vLLM's ``prefix_cache_queries`` / ``_hits``): a
    request's first admission; the recompute of a preempted request (its prompt and generated tokens, found
    again in its own blocks) counts apart, as vLLM's ``preempted_*``."""

    requests: int = 0  # first admissions
    queries: int = 0  # their prompt tokens
    hits: int = 0  # of those, tokens found cached
    preempted_requests: int = 0  # re-admissions after a preemption
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_cached: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_cached
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_cached

    @property
    def hit_rate(self) -> float:
        """hits / queries, 0.0 before any query."""
        return self.hits / self.queries if self.queries else 0.0


class Scheduler:
    """Decides each step which requests compute how many tokens, and keeps the KV blocks in step."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        enable_chunked_prefill: bool = True,
        kv_cache_key: str | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.enable_chunked_prefill = enable_chunked_prefill
        # the engine argument that sized the KV cache (num_gpu_blocks, kv_cache_memory, ...): the key of the
        # error for a request that can never fit it, for the CLI to name its flag
        self.kv_cache_key = kv_cache_key
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_preemptions = 0  # since start, every request's (vLLM's num_preemptions counter)
        self.hash_memo = PromptHashMemo(block_manager.block_size)

    @property
    def enable_prefix_caching(self) -> bool:
        return self.block_manager.enable_prefix_caching

    def check_prompt_fits(self, num_tokens: int) -> None:
        """Raise ConfigError (a ValueError) if a prompt of ``num_tokens`` tokens can never be scheduled: it
        cannot fit the KV cache (keyed ``kv_cache_key``; the message says how many prompt tokens fit) or, with
        chunked prefill off, the token budget (keyed max_num_batched_tokens)."""
        bm = self.block_manager
        if bm.blocks_needed(num_tokens + 1) > bm.num_blocks:
            # the prompt, not the request id: the id is the engine's own (a CLI user never sees it)
            raise ConfigError(
                prompt_exceeds_kv_cache(
                    num_tokens, bm.blocks_needed(num_tokens + 1), bm.num_blocks, bm.block_size, self.kv_cache_key
                )
            )
        if not self.enable_chunked_prefill and num_tokens > self.max_num_batched_tokens:
            # a ValueError that names the setting, for the CLI to name its flag
            raise ConfigError(prompt_exceeds_step(num_tokens, self.max_num_batched_tokens))

    def add_request(self, request: Request) -> None:
        """Queue a request. Raises :meth:`check_prompt_fits`' ConfigError if it can never be scheduled."""
        self.check_prompt_fits(request.num_tokens)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        # each request's share is made (and its blocks registered) as it is scheduled: a request admitted later
        # in this step may find them cached
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        i = 0
        running = self.running
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = min(req.num_tokens + req.num_pending - req.num_computed_tokens, budget)
            if num_new <= 0 or (req.num_pending and req.length_reached_with_pending()):
                i += 1  # its last token is in flight and ends it: nothing to compute
                continue
            while not self.block_manager.allocate(req.request_id, req.num_computed_tokens + num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled.append(self._scheduled(req, num_new))
                budget -= num_new
                i += 1
        # admit waiting requests only when nothing was preempted this step (it would just thrash)
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.num_pending:  # preempted while its token was in flight: recompute once it is known
                break
            cached_blocks = self._cached_prefix(req)
            num_cached = len(cached_blocks) * self.block_manager.block_size
            num_new = req.num_tokens - num_cached
            # chunked prefill off: a prompt must fit one step; a preempted request's recompute (its prompt and what
            # it generated, which may have outgrown any step) goes in chunks, or it would wait forever
            if num_new > budget and not self.enable_chunked_prefill and not req.output_token_ids:
                break
            num_new = min(num_new, budget)
            if not self.block_manager.allocate(req.request_id, num_cached + num_new, cached_blocks):
                break
            req.num_computed_tokens = num_cached
            readmitted = req.num_cached_tokens is not None
            if not readmitted:  # the first admission's, as vLLM reports it
                req.num_cached_tokens = num_cached
            if self.enable_prefix_caching:
                self.prefix_cache_stats.record(req.num_tokens, num_cached, preempted=readmitted)
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(self._scheduled(req, num_new, admitted=True))
            budget -= num_new
        scheduled.sort(key=lambda s: len(s.token_ids) > 1)  # stable: decodes first, then prefills
        out = SchedulerOutput(
            requests=scheduled,
            preempted_ids=preempted,
            finished_ids=self._finished_ids,
        )
        self._finished_ids = []
        return out

    def _cached_prefix(self, req: Request) -> list[int]:
        """The cached blocks a waiting request (no computed tokens) starts with: its longest cached run of full
        blocks, short of its last token."""
        if not self.enable_prefix_caching or req.sampling_params.prompt_logprobs is not None:
            return []  # prompt logprobs need the logits of every prompt position (vLLM skips the cache too)
        bm = self.block_manager
        if not req.block_hashes and not req.output_token_ids:  # first admission: the prompt's full blocks
            req.block_hashes = self.hash_memo.prompt_hashes(req.prompt_token_ids)
        hashes = extend_block_hashes(req.block_hashes, req.num_tokens, req.token_slice, bm.block_size)
        return bm.lookup(hashes, (req.num_tokens - 1) // bm.block_size)

    def _scheduled(self, req: Request, num_new: int, admitted: bool = False) -> ScheduledRequest:
        """The request's share of the step; advances its computed tokens (and pending ones when it samples).
        ``admitted``: the step admits it (first time, or again after a preemption)."""
        num_pending = req.num_pending  # before this step
        num_tokens = req.num_tokens
        start = req.num_computed_tokens
        end = start + num_new
        token_ids = req.token_slice(start, min(end, num_tokens))  # O(num_new), not O(sequence length)
        if end > num_tokens:  # the pending token: the runner takes it from the last step's samples
            token_ids.append(PLACEHOLDER_TOKEN)
        samples = end == num_tokens + num_pending
        req.num_computed_tokens = end
        if samples:
            req.num_pending = num_pending + 1
        bm = self.block_manager
        if bm.enable_prefix_caching:  # the blocks this step fills with known tokens (a decode: one step in block_size)
            full = min(end, num_tokens) // bm.block_size
            if full > bm.num_registered.get(req.request_id, 0):
                hashes = extend_block_hashes(req.block_hashes, full * bm.block_size, req.token_slice, bm.block_size)
                bm.cache_blocks(req.request_id, hashes, full)
        s = ScheduledRequest(
            req.request_id, token_ids, start, bm.block_tables[req.request_id], req.sampling_params, samples
        )
        p = req.sampling_params
        if p.changes_logits or p.prompt_logprobs is not None:
            num_output = len(req.output_token_ids) + num_pending
            s.num_output_tokens, s.output_pending, s.eos_token_id = num_output, num_pending > 0, req.eos_token_id
            prompt_step = p.prompt_logprobs is not None and start < len(req.prompt_token_ids)
            if (admitted and p.has_penalties) or prompt_step:
                s.prompt_token_ids, s.output_token_ids = list(req.prompt_token_ids), list(req.output_token_ids)
            if p.bad_words_history > 0:
                s.recent_output_ids = req.output_token_ids[-p.bad_words_history :]
        return s

    def _preempt(self, req: Request) -> None:
        self.block_manager.free(req.request_id)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def update(self, output: SchedulerOutput, sampled: dict[str, tuple[int, object]]) -> list[Request]:
        """Append each sampling request's token ``(token_id, logprobs)`` (its computed tokens advanced when
        the step was scheduled). A request that ended or was aborted while the step ran is skipped: under
        async scheduling its token of the step after its last is computed and dropped here.

        Returns the requests that got a new token (finished ones included, already freed).
        """
        updated = []
        for s in output.requests:
            req = self.requests.get(s.request_id)
            if req is None or req.is_finished or not s.samples:  # aborted or ended while the step ran
                continue
            req.num_pending -= 1
            token_id, logprobs = sampled[s.request_id]
            req.append_token(token_id, logprobs)
            updated.append(req)
            if req.is_finished:
                self._release(req)
        return updated

    def finish_request(self, request_id: str, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        """End a request (a stop string was seen, or it was aborted) and free its blocks."""
        req = self.requests.get(request_id)
        if req is None:
            return
        if not req.is_finished:
            req.finish(reason, stop_reason)
        self._release(req)

    def _release(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.block_manager.free(req.request_id)
        self.requests.pop(req.request_id, None)
        self._finished_ids.append(req.request_id)
