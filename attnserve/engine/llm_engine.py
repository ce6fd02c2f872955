"""LLMEngine: add_request / step / abort. The orchestrator: schedule, execute, update, detokenize.

With async scheduling a step schedules and queues step k+1, then reads step k's tokens (queued by the
previous call) and processes them, so the host's work for a step overlaps the device's work for the one
before; ``step()`` returns the outputs of the step it read.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import logging

from attnserve.config.engine import EngineConfig
from attnserve.config.fields import ConfigError
from attnserve.config.scheduler import EngineUsage, check_usage, default_max_num_batched_tokens
from attnserve.engine.block_manager import BlockManager
from attnserve.engine.output_processor import OutputProcessor
from attnserve.engine.request import FinishReason, Request
from attnserve.engine.input_checks import InputChecks
from attnserve.core.sampling_params import SamplingParams, completion_seed
from attnserve.core.step import SchedulerOutput
from attnserve.engine.scheduler import Scheduler
from attnserve.engine.structured_steps import StructuredSteps
from attnserve.engine.outputs import RequestOutput
from attnserve.executor.base import WorkerDiedError
from attnserve.executor.loading import load_model
from attnserve.structured_output.manager import StructuredOutputManager
from attnserve.platforms import check_runnable_device, detect_platform
from attnserve.model_executor.kv_cache import check_kv_cache_holds_max_model_len, kv_cache_size_key

logger = logging.getLogger(__name__)


def resolve_step_budget(config: EngineConfig, usage: EngineUsage) -> EngineConfig:
    """``config`` with ``scheduler.max_num_batched_tokens`` filled in when unset: vLLM's default for this device
    and ``usage`` ("llm" or "server"; see :func:`default_max_num_batched_tokens`). Raises ConfigError for a device
    that cannot run (as loading would)."""
    if config.scheduler.max_num_batched_tokens is not None:
        return config
    check_runnable_device(config.device)
    platform = detect_platform(config.device)
    budget = default_max_num_batched_tokens(platform.device_type, platform.total_memory, usage)
    return dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler, max_num_batched_tokens=budget))


def resolve_async_scheduling(config: EngineConfig, device) -> bool:
    """``scheduler.async_scheduling``, or when unset: on for a GPU (one or several ranks), off on CPU."""
    chosen = config.scheduler.async_scheduling
    if chosen is not None:
        return chosen
    return device.type == "cuda"


class LLMEngine:
    """Continuous-batching engine over one model. Not thread-safe: one caller steps it."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        warn_kv_cache_limit: bool = True,
        refuse_short_kv_cache: bool = False,
        usage: EngineUsage = "llm",
    ) -> None:
        """Load the model and its executor. ``warn_kv_cache_limit`` False: the caller calls
        :meth:`warn_kv_cache_limit` itself, once it has checked its prompts (``attnserve generate``: a prompt the
        KV cache cannot hold is then one error line, not that warning and then the error). ``refuse_short_kv_cache``
        (the server): a KV cache that holds fewer tokens than max_model_len is an error (a ConfigError keyed to the
        KV-cache setting, naming the largest max_model_len that fits), as in vLLM, instead of that warning. ``usage``
        ("llm" or "server"; anything else is refused, a Refused at path ``usage``): which of vLLM's defaults an
        unset step token budget takes."""
        config = resolve_step_budget(config, check_usage(usage))
        self.config = config
        loaded = load_model(config)  # executor.loading: the checks, the tokenizer, the weights (GGUF-cache retry)
        self.hf_config, self.tokenizer, self.executor = loaded.hf_config, loaded.tokenizer, loaded.executor
        self.max_model_len = loaded.max_model_len
        # --generation-config's default sampling values (SamplingParams field -> value; {} for none)
        self.generation_defaults = loaded.generation_defaults
        self.info = self.executor.info  # backend, device, dtype, KV blocks (rank 0's under tensor parallelism)
        # the in-process ModelRunner (tensor_parallel_size 1 only; None when workers run the model)
        self.runner = getattr(self.executor, "runner", None)
        self.block_manager = BlockManager(
            self.info.num_blocks, config.cache.block_size, config.cache.enable_prefix_caching
        )
        # the longest a sequence may grow: past the whole KV cache it would preempt itself and wait forever
        # for blocks that can never be free, so it ends there (finish_reason length) as at max_model_len
        self.max_request_len = min(self.max_model_len, self.info.num_blocks * config.cache.block_size)
        if refuse_short_kv_cache:
            self._refuse_short_kv_cache()
        self.scheduler = Scheduler(
            self.block_manager,
            config.scheduler.max_num_batched_tokens,
            config.scheduler.max_num_seqs,
            config.scheduler.enable_chunked_prefill,
            kv_cache_size_key(config.cache, self.info.device),
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        # the bitmask buffers pinned where this process copies them to a GPU (not for worker processes: pickled)
        local_gpu = self.runner is not None and self.info.device.type == "cuda"
        self.structured = StructuredOutputManager(
            self.tokenizer, self.vocab_size, self.eos_token_id, local_gpu, config.scheduler.max_num_seqs
        )
        if local_gpu and importlib.util.find_spec("xgrammar") is not None:  # no compile in a constrained step
            self.runner.greedy_head.warm_masked()
        self.checks = InputChecks(
            self.tokenizer,
            self.vocab_size,
            self.max_model_len,
            config.model.max_logprobs,
            self.scheduler.check_prompt_fits,
            self.structured.compile,
        )
        self._ids = itertools.count()
        self.async_scheduling = resolve_async_scheduling(config, self.info.device)
        self._in_flight: tuple[SchedulerOutput, object] | None = None  # queued step not read yet (async)
        self.structured_steps = StructuredSteps(self)  # the step while a constrained request runs
        if warn_kv_cache_limit:
            self.warn_kv_cache_limit()

    def _refuse_short_kv_cache(self) -> None:
        """Raise ConfigError (and stop the workers) when the KV cache holds fewer tokens than max_model_len."""
        cache = self.config.cache
        try:
            check_kv_cache_holds_max_model_len(
                self.max_model_len, self.info.num_blocks, cache.block_size, kv_cache_size_key(cache, self.info.device)
            )
        except ConfigError:
            self.executor.shutdown()  # the workers, under tensor parallelism
            raise

    def warn_kv_cache_limit(self) -> None:
        """Log a warning when the KV cache holds fewer tokens than max_model_len: requests end there and longer
        prompts are refused (:meth:`check_prompt` says so for each prompt it refuses)."""
        if self.max_request_len < self.max_model_len:
            logger.warning(
                "the KV cache holds %d tokens, fewer than max_model_len %d: a request ends (finish_reason "
                "length) when it reaches %d tokens, and a prompt of %d tokens or more is refused; give the "
                "KV cache more memory or lower max_model_len",
                self.max_request_len,
                self.max_model_len,
                self.max_request_len,
                self.max_request_len,
            )

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def vocab_size(self) -> int:
        """Token ids are integers in [0, vocab_size)."""
        return self.hf_config.vocab_size

    @property
    def max_logprobs(self) -> int:
        """The most logprobs a request may ask for per token: ``--max-logprobs``, -1 = the vocabulary size."""
        return self.checks.max_logprobs

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the generation config's default values (vLLM's ``get_default_sampling_params``):
        what ``LLM.generate`` uses when it is given none."""
        return SamplingParams(**self.generation_defaults)

    # the request checks (``input_checks``): add_request runs the first two; the server, ``LLM`` and ``attnserve
    # generate`` run them first, to refuse a request before anything is queued
    def check_params(self, params: SamplingParams) -> None:
        """:meth:`InputChecks.check_params`: ``params`` against this model and engine."""
        self.checks.check_params(params)

    def check_prompt(
        self,
        prompt: str | list[int],
        path: tuple[str | int, ...] = ("prompt",),
        truncate_prompt_tokens: int | None = None,
    ) -> list[int]:
        """:meth:`InputChecks.check_prompt`: the prompt's token ids, once it is known to fit."""
        return self.checks.check_prompt(prompt, path, truncate_prompt_tokens)

    def truncate(self, token_ids: list[int], truncate_prompt_tokens: int | None) -> list[int]:
        """:meth:`InputChecks.truncate`: vLLM's ``truncate_prompt_tokens``."""
        return self.checks.truncate(token_ids, truncate_prompt_tokens)

    def check_max_tokens(
        self, num_prompt_tokens: int, params: SamplingParams, path: tuple[str | int, ...] = ("prompt",)
    ) -> None:
        """:meth:`InputChecks.check_max_tokens`; :meth:`add_request` does not call it (a request it takes ends at
        max_model_len, finish_reason ``length``)."""
        self.checks.check_max_tokens(num_prompt_tokens, params, path)

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        prompt_token_ids: list[int] | None = None,
        final_only: bool = False,
    ) -> str:
        """Queue a prompt (text or token ids) with ``params.n`` completions; returns the request id.

        ``prompt_token_ids``: the text prompt's ids when the caller already ran :meth:`check_prompt`.
        ``final_only``: :meth:`step` returns the request's output only when it finishes (``LLM.generate``, which
        reads only those, as vLLM's FINAL_ONLY output kind).
        Raises PromptTooLongError when the prompt has max_model_len tokens or more, :meth:`check_params`'
        SamplingParamsError for parameters the model cannot honour. The request keeps ``params.snapshot()``: fields
        changed after construction are checked, and later changes reach no queued request.
        """
        params = params.snapshot()
        self.check_params(params)
        request_id = request_id if request_id is not None else str(next(self._ids))
        token_ids = prompt_token_ids if prompt_token_ids is not None else self.check_prompt(prompt)
        children = []
        for i in range(params.n):
            child_params = params
            if params.n > 1:
                seed = None if params.seed is None else completion_seed(params.seed, i)
                child_params = dataclasses.replace(params, n=1, seed=seed)
            children.append(
                Request(
                    request_id=f"{request_id}#{i}",
                    prompt_token_ids=token_ids,
                    sampling_params=child_params,
                    eos_token_id=self.eos_token_id,
                    max_model_len=self.max_request_len,
                )
            )
        self.output_processor.add(
            request_id, prompt if isinstance(prompt, str) else None, token_ids, params, children, final_only
        )
        if params.structured_outputs is not None:
            for child in children:
                self.structured.add(child.request_id, params.structured_outputs)
        for child in children:
            self.scheduler.add_request(child)
        return request_id

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its KV blocks. Returns its final output: the text and tokens so far, each
        unfinished completion with finish_reason "abort"; None (and nothing done) for an unknown or finished id."""
        for child_id in self.output_processor.child_ids(request_id):
            self.scheduler.finish_request(child_id, FinishReason.ABORT)
            self.structured.remove(child_id)
        return self.output_processor.abort(request_id)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prompt prefix: later requests compute their prompts anew (blocks in use stay with
        their requests). Returns how many blocks were cached."""
        return self.block_manager.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, append sampled tokens; returns outputs of requests that changed.

        Async scheduling: queue this step, then finish the previous one (its outputs are returned). While a
        constrained request (structured outputs) runs, a step's grammar bitmask needs the tokens of the step
        before: ``structured_steps.py`` orders the step then.
        """
        if self.structured.active:
            if self.async_scheduling and hasattr(self.executor, "queue_forward"):
                return self.structured_steps.step_async()
            return self.structured_steps.step()
        sched = self._schedule()
        try:
            if not self.async_scheduling:
                return self._finish(sched, self.executor.execute(sched))
            queued = self.executor.execute_async(sched)
            previous, self._in_flight = self._in_flight, (None if sched.is_empty else (sched, queued))
            return self._finish(*previous) if previous is not None else []
        except WorkerDiedError:
            self._in_flight = None
            self._fail_all()
            raise
        except BaseException:
            self._in_flight = None  # its requests are aborted by the caller (LLM, server); nothing reads it
            # blocks registered when this step was scheduled may never have been computed
            self.block_manager.reset_prefix_cache()
            raise

    def _schedule(self) -> SchedulerOutput:
        """The next step's plan: the one scheduled ahead, less the requests aborted since, else a new one."""
        sched = self.structured_steps.take_scheduled_ahead()
        return sched if sched is not None else self.scheduler.schedule()

    def _finish(self, sched: SchedulerOutput, result) -> list[RequestOutput]:
        """Append a step's sampled tokens (``result.result()``: waits for them), advance the grammar matchers (a
        terminated grammar ends its request, finish reason stop), detokenize, apply stop strings."""
        updated = self._update(sched, result)
        outputs = self._outputs(updated)
        self.structured_steps.remove_finished_matchers(updated)
        return outputs

    def _update(self, sched: SchedulerOutput, result, defer_accept: bool = False) -> list[Request]:
        """:meth:`_finish`'s first half: the step's tokens appended and the grammar matchers advanced (``defer_accept``:
        only by stop tokens now, the rest by the next bitmask fill: ``StructuredOutputManager.accept_tokens``);
        returns the requests that changed."""
        out = result.result()
        for rid, (first, entries) in out.prompt_logprobs.items():
            req = self.scheduler.requests.get(rid)
            if req is not None and first + len(entries) > len(req.prompt_logprobs):  # a recompute repeats them
                req.prompt_logprobs.extend(entries[len(req.prompt_logprobs) - first :])
        updated = self.scheduler.update(sched, out.sampled)
        self.structured_steps.advance_matchers(updated, defer_accept)
        return updated

    def _outputs(self, updated: list[Request]) -> list[RequestOutput]:
        """:meth:`_finish`'s second half: detokenize, apply stop strings, make the outputs. The matchers of requests
        a stop string ended stay until the caller drops them (a bitmask fill may still read them)."""
        outputs, stopped = self.output_processor.process(updated)
        for child_id, stop_string in stopped:
            self.scheduler.finish_request(child_id, FinishReason.STOP, stop_string)
        return outputs

    def _fail_all(self) -> None:
        """The model can no longer run: finish every request (aborted) so nothing waits on a dead engine."""
        for request_id in list(self.output_processor.parents):
            self.abort_request(request_id)

    def shutdown(self) -> None:
        """Stop the executor's workers or release its in-process runner (also done when the engine is
        garbage-collected or at exit), and the grammar process; the engine runs nothing afterwards."""
        self.runner = None
        self.structured.close()
        self.executor.shutdown()
