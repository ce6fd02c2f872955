"""``attnserve bench throughput``: offline throughput of a batch of requests through the engine.

All requests are queued at once and the engine steps until every one has generated exactly its output
length (greedy, ``ignore_eos``). Throughput = tokens / wall time of the stepping (model load and one
short warm-up request excluded). With ``baseline="transformers"`` the same requests then run through
transformers' ``generate`` in static batches of ``max_num_seqs`` in request order, each batch generating
its longest output length (what static batching costs); only the requested tokens are counted. With
``baseline="vllm"`` they run through vLLM in a subprocess (``vllm_baseline.py``).

Each row carries the roofline of its own steps (``roofline.py``): every step reads the weights once and
the K/V of each running request's context; limit = those bytes over the copy bandwidth, % = limit / elapsed.
"""

from __future__ import annotations

import time

from dataclasses import asdict, dataclass, field

import numpy as np

from attnserve.benchmarks.requests import BenchRequest
from attnserve.benchmarks.roofline import Roofline, RooflineRow
from attnserve.engine.gc_heap import frozen_heap
from attnserve.benchmarks.stats import now

TIMELINE_POINTS = 200  # most (time, tokens) points kept per row for the plot


@dataclass(frozen=True)
class ThroughputRow:
    """One implementation's result on the workload."""

    name: str  # "attnserve", "transformers" or "vllm"
    num_requests: int
    total_output_tokens: int  # generated tokens that were asked for
    total_tokens: int  # prompt + output tokens
    elapsed_s: float
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    num_steps: int | None  # forward passes (engine steps, or generate's steps summed over batches); None: vllm
    roofline: RooflineRow
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds, output tokens so far)
    ttft_p50_ms: float | None = None  # median time to first token from queueing (engine rows)
    prefix_caching: bool | None = None  # engine rows: whether the prefix cache was on
    prefix_cache_hit_rate: float | None = None  # prompt tokens found cached / looked up, in this run
    num_cached_tokens: int | None = None  # prompt tokens found cached in this run

    def to_dict(self) -> dict:
        return asdict(self)


def _row(
    name: str,
    num_requests: int,
    in_tokens: int,
    out_tokens: int,
    elapsed: float,
    steps: int,
    kv_tokens: int,
    roofline: Roofline,
    timeline: list[tuple[float, int]],
    **engine_fields,
) -> ThroughputRow:
    total = out_tokens + in_tokens
    stride = max(1, len(timeline) // TIMELINE_POINTS)
    return ThroughputRow(
        name=name,
        num_requests=num_requests,
        total_output_tokens=out_tokens,
        total_tokens=total,
        elapsed_s=elapsed,
        requests_per_s=num_requests / elapsed,
        output_tokens_per_s=out_tokens / elapsed,
        total_tokens_per_s=total / elapsed,
        num_steps=steps,
        roofline=roofline.row(roofline.run_limit_s(steps, kv_tokens), elapsed),
        timeline=timeline[::stride] + ([timeline[-1]] if timeline and (len(timeline) - 1) % stride else []),
        **engine_fields,
    )


def warm_up_engine(engine, requests: list[BenchRequest]) -> None:
    """One short request first, so that one-time costs (allocator, lazy init) stay out of the timing."""
    from attnserve.core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, detokenize=False)
    engine.add_request(requests[0].prompt_token_ids[:16], params)
    while engine.has_unfinished_requests():
        engine.step()


def run_engine(
    engine, requests: list[BenchRequest], roofline: Roofline, progress: bool = True, name: str = "attnserve"
) -> ThroughputRow:
    """Queue every request (a conversation's next turn once its turn before has finished), step until all finish;
    count steps, the cached tokens each step reads, TTFTs and the prefix cache's hits in this run."""
    from tqdm import tqdm

    from attnserve.core.sampling_params import SamplingParams

    device = engine.info.device
    warm_up_engine(engine, requests)
    engine.reset_prefix_cache()  # the run starts cold: the warm-up computed the start of a prompt
    stats = engine.scheduler.prefix_cache_stats
    queries0, hits0 = stats.queries, stats.hits
    bar = tqdm(total=sum(r.num_turns for r in requests), desc=name, unit="req", disable=not progress)
    pending: dict[str, BenchRequest] = {}
    in_tokens = 0

    def add(r: BenchRequest) -> None:
        nonlocal in_tokens
        # detokenize=False: the benchmark counts tokens, so no per-token decoding in the timed loop
        params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True, detokenize=False)
        pending[engine.add_request(r.prompt_token_ids, params)] = r
        in_tokens += r.input_len

    with frozen_heap():  # no full-collection pause inside the timed loop (gc_heap.py)
        t0 = now(device)
        for r in requests:
            add(r)
        steps = kv_tokens = out_tokens = 0
        lengths: dict[str, int] = {}
        ttfts: list[float] = []
        timeline: list[tuple[float, int]] = []
        while engine.has_unfinished_requests():
            outputs = engine.step()
            steps += 1
            for o in outputs:
                c = o.outputs[0]
                # the step that produced token k read the prompt and the k - 1 tokens before it
                kv_tokens += len(o.prompt_token_ids) + len(c.token_ids) - 1
                out_tokens += len(c.token_ids) - lengths.get(o.request_id, 0)
                lengths[o.request_id] = len(c.token_ids)
                if o.finished:
                    bar.update(1)
                    ttfts.append(o.metrics.ttft)
                    follow_up = pending.pop(o.request_id).next_turn(list(c.token_ids))
                    if follow_up is not None:
                        add(follow_up)
            # no device sync per step: it would stop the host from scheduling step k+1 while step k runs; a step's
            # outputs are read after its tokens reached the host, so the host clock dates them
            timeline.append((time.perf_counter() - t0, out_tokens))
        elapsed = now(device) - t0
    bar.close()
    queries, hits = stats.queries - queries0, stats.hits - hits0
    return _row(
        name,
        len(lengths),
        in_tokens,
        out_tokens,
        elapsed,
        steps,
        kv_tokens,
        roofline,
        timeline,
        ttft_p50_ms=float(np.median(ttfts)) * 1000.0 if ttfts else None,
        prefix_caching=engine.block_manager.enable_prefix_caching,
        prefix_cache_hit_rate=hits / queries if queries else 0.0,
        num_cached_tokens=hits,
    )


def run_engine_with_and_without_prefix_caching(
    engine, requests: list[BenchRequest], roofline: Roofline, progress: bool = True
) -> list[ThroughputRow]:
    """The same requests on the same engine with its configured prefix caching, then with the other setting
    (each run starts with an empty cache); rows in that order. An untimed pass of the whole workload comes first,
    so that one-time costs (kernel compiles for new shapes, allocator growth) fall on neither row: without it the
    row run first pays them."""
    bm = engine.block_manager
    configured = bm.enable_prefix_caching
    bm.enable_prefix_caching = False
    run_engine(engine, requests, roofline, progress=False, name="warm-up")
    rows = []
    for enabled in (configured, not configured):
        bm.enable_prefix_caching = enabled
        rows.append(
            run_engine(
                engine, requests, roofline, progress, name="attnserve" if enabled else "attnserve (no prefix caching)"
            )
        )
    return rows


def run_transformers(
    baseline, requests: list[BenchRequest], batch_size: int, roofline: Roofline, progress: bool = True
) -> ThroughputRow:
    """Static batches of ``batch_size`` requests in order through ``TransformersBaseline.generate``."""
    from tqdm import tqdm

    baseline.generate([requests[0].prompt_token_ids[:16]], 2)  # warm-up
    bar = tqdm(total=len(requests), desc="transformers", unit="req", disable=not progress)
    elapsed = 0.0
    steps = kv_tokens = out_tokens = 0
    timeline: list[tuple[float, int]] = []
    for i in range(0, len(requests), batch_size):
        batch = requests[i : i + batch_size]
        new = max(r.output_len for r in batch)
        elapsed += baseline.generate([r.prompt_token_ids for r in batch], new).seconds
        steps += new
        # every row runs all `new` steps; step j reads the row's prompt and j earlier tokens
        kv_tokens += new * sum(r.input_len for r in batch) + len(batch) * new * (new - 1) // 2
        out_tokens += sum(r.output_len for r in batch)
        timeline.append((elapsed, out_tokens))
        bar.update(len(batch))
    bar.close()
    return _row(
        "transformers",
        len(requests),
        sum(r.input_len for r in requests),
        out_tokens,
        elapsed,
        steps,
        kv_tokens,
        roofline,
        timeline,
    )


def vllm_row(result: dict, requests: list[BenchRequest], limit_s: float, roofline: Roofline) -> ThroughputRow:
    """The vLLM runner's result as a row. Its steps are not seen from here: its % of limit uses the limit of
    attnserve's run of the same requests (``limit_s``)."""
    elapsed, out_tokens = result["elapsed_s"], result["output_tokens"]
    in_tokens = sum(r.input_len for r in requests)
    return ThroughputRow(
        name="vllm",
        num_requests=len(requests),
        total_output_tokens=out_tokens,
        total_tokens=in_tokens + out_tokens,
        elapsed_s=elapsed,
        requests_per_s=len(requests) / elapsed,
        output_tokens_per_s=out_tokens / elapsed,
        total_tokens_per_s=(in_tokens + out_tokens) / elapsed,
        num_steps=None,
        roofline=roofline.row(limit_s, elapsed),
        timeline=[(0.0, 0), (elapsed, out_tokens)],
    )


def format_table(rows: list[ThroughputRow], ratio: float | None) -> str:
    """The short table printed last; engine rows also show TTFT p50 and the prefix cache's hit rate."""
    head = (
        f"{'':<30} {'requests/s':>10} {'output tok/s':>12} {'total tok/s':>11} {'elapsed s':>9} "
        f"{'% of limit':>10} {'TTFT p50 ms':>11} {'cache hits':>10}"
    )
    lines = [head]
    for r in rows:
        pct = r.roofline.pct_of_limit
        ttft = "" if r.ttft_p50_ms is None else f"{r.ttft_p50_ms:.1f}"
        hits = (
            "" if r.prefix_cache_hit_rate is None or not r.prefix_caching else f"{100 * r.prefix_cache_hit_rate:.1f}%"
        )
        lines.append(
            f"{r.name:<30} {r.requests_per_s:>10.2f} {r.output_tokens_per_s:>12.1f} "
            f"{r.total_tokens_per_s:>11.1f} {r.elapsed_s:>9.2f} {pct:>9.1f}% {ttft:>11} {hits:>10}"
        )
    if ratio is not None:
        lines.append(f"attnserve / {rows[-1].name} (output tok/s): {ratio:.2f}x")
    caching = prefix_caching_ratios(rows)
    if caching is not None:
        lines.append(
            f"prefix caching on / off: output tok/s {caching['output_tokens_per_s']:.2f}x, "
            f"TTFT p50 {caching['ttft_p50']:.2f}x as fast"
        )
    return "\n".join(lines)


def prefix_caching_ratios(rows: list[ThroughputRow]) -> dict[str, float] | None:
    """On over off, for a run that measured both: output tok/s (on / off) and TTFT p50 (off / on: how many times
    faster the first token comes with caching on)."""
    by = {r.prefix_caching: r for r in rows if r.prefix_caching is not None}
    if len(by) != 2:
        return None
    on, off = by[True], by[False]
    return {
        "output_tokens_per_s": on.output_tokens_per_s / off.output_tokens_per_s,
        "ttft_p50": off.ttft_p50_ms / on.ttft_p50_ms if on.ttft_p50_ms else float("inf"),
    }


def run_throughput(
    config,
    *,
    num_prompts: int | None,
    input_len: int | None,
    output_len: int,
    range_ratio: float,
    prompts_file: str | None = None,
    baseline: str | None = None,
    progress: bool = True,
    prefix_len: int = 0,
    num_turns: int = 1,
    compare_prefix_caching: bool = False,
) -> dict:
    """The whole benchmark: requests, the engine's row (and its row with prefix caching the other way, with
    ``compare_prefix_caching``), the baseline's row; the JSON-ready result.
    ``input_len``: the random prompts' length; None with ``prompts_file``.

    Raises ValueError (requests that do not fit max_model_len; a baseline with ``num_turns`` > 1, whose later
    prompts hold the engine's answers), PromptsFileError (a ValueError: a prompts file that is not UTF-8 text or
    has no prompts; before the model loads) and OSError (file).
    """
    from attnserve.benchmarks.offline import (
        check_lengths,
        check_requests_fit,
        start_baseline,
        start_engine,
        stop_engine,
    )
    from attnserve.benchmarks.requests import PromptsFileError, file_requests, random_requests, read_prompts_file
    from attnserve.refusals.bench import turns_with_baseline
    from attnserve.refusals.cli import RANDOM_PROMPTS, no_prompts
    from attnserve.refusals import Refused

    seed = config.model.seed
    if baseline and num_turns > 1:
        raise Refused(turns_with_baseline(num_turns))
    if baseline == "vllm":
        from attnserve.benchmarks.vllm_baseline import check_vllm_baseline

        check_vllm_baseline(config.model.model)
    elif baseline == "transformers":
        from attnserve.benchmarks.hf_baseline import check_transformers_baseline

        check_transformers_baseline(config.model.model, config.model.load_format)
    texts = read_prompts_file(prompts_file) if prompts_file else None
    if texts == []:
        raise PromptsFileError(no_prompts(prompts_file, "--prompts-file", RANDOM_PROMPTS))
    engine, facts, roofline = start_engine(config)
    if texts:
        requests = file_requests([engine.check_prompt(t) for t in texts], num_prompts, output_len, range_ratio, seed)
    else:
        requests = random_requests(
            num_prompts or 1000,
            input_len,
            output_len,
            range_ratio,
            facts.prompt_vocab_size,
            seed,
            prefix_len=prefix_len,
            num_turns=num_turns,
        )
    last_turns = [r.last_turn_lens for r in requests]
    # the flags that shaped the longest request: the one to lower is among them
    flags = ["--prompts-file"] if texts else ["--input-len"] + (["--prefix-len"] if prefix_len else [])
    flags += ["--output-len", "--range-ratio"] + (["--num-turns"] if num_turns > 1 else [])
    check_lengths(max(p for p, _ in last_turns), max(o for _, o in last_turns), facts.max_model_len, flags)
    check_requests_fit(engine, max(p for p, _ in last_turns))

    if compare_prefix_caching:
        rows = run_engine_with_and_without_prefix_caching(engine, requests, roofline, progress)
    else:
        rows = [run_engine(engine, requests, roofline, progress)]
    stop_engine(engine, facts)
    del engine
    vllm_settings = None
    if baseline == "vllm":
        from attnserve.benchmarks.vllm_baseline import run_vllm, throughput_spec

        result = run_vllm(throughput_spec(facts, requests, config.parallel.tensor_parallel_size))
        vllm_settings = {"vllm_version": result["vllm_version"], **result["settings"]}
        rows.append(vllm_row(result, requests, rows[0].roofline.limit_s, roofline))
    elif baseline:
        hf = start_baseline(baseline, facts)
        rows.append(run_transformers(hf, requests, facts.max_num_seqs, roofline, progress))
        hf.close()
    ratio = rows[0].output_tokens_per_s / rows[-1].output_tokens_per_s if baseline else None
    return {
        "kind": "throughput",
        "engine": facts.to_dict(),
        "workload": {
            "num_prompts": len(requests),
            "input_len": input_len,
            "output_len": output_len,
            "range_ratio": range_ratio,
            "prefix_len": prefix_len,
            "num_turns": num_turns,
            "seed": seed,
            "prompts_file": prompts_file,
            "ignore_eos": True,
            "temperature": 0.0,
            "total_input_tokens": rows[0].total_tokens - rows[0].total_output_tokens,
            "total_output_tokens": rows[0].total_output_tokens,
            # every request run, a conversation's turns in order
            "input_lens": [p for r in requests for p, _ in r.turn_lens],
            "output_lens": [o for r in requests for _, o in r.turn_lens],
        },
        "roofline": roofline.to_dict(),
        "baseline": baseline,
        "baseline_settings": vllm_settings,  # vllm: its version and what its defaults resolved to
        "ratio_vs_baseline": ratio,
        "prefix_caching_ratio": prefix_caching_ratios(rows),
        "results": [r.to_dict() for r in rows],
        "table": format_table(rows, ratio),
    }
