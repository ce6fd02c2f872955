"""``attnserve bench latency``: time one batch of requests from submission to the last token.

For each batch size B: ``num_iters_warmup`` untimed iterations, then ``num_iters`` timed ones; each
iteration submits B fresh random prompts of exactly ``input_len`` tokens (seeded), each generating exactly
``output_len`` tokens (greedy, ``ignore_eos``). Per request: TTFT (submission to first token), TPOT
((E2E - TTFT) / (output_len - 1)) and E2E; per iteration the batch latency; percentiles p50/p90/p99 over
all of them. Output tokens/s = B * output_len * num_iters / total batch latency.

The transformers baseline runs the same prompts as one static batch: TTFT = a ``generate`` of one new
token, E2E = a ``generate`` of ``output_len`` tokens, TPOT from the two (so its percentiles are over
iterations: every row of a static batch finishes together). The vLLM baseline (``vllm_baseline.py``) times
the same prompts the same way through ``vllm.LLM.generate``.

Roofline per row (``roofline.py``): the mean decode step reads the weights and B x (input_len +
output_len / 2) cached tokens; limit TPOT = those bytes / copy bandwidth; % of limit = limit / mean TPOT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnserve.benchmarks.requests import BenchRequest, random_requests
from attnserve.benchmarks.roofline import Roofline, RooflineRow, mean_decode_context
from attnserve.benchmarks.stats import now, summarize
from attnserve.engine.gc_heap import frozen_heap


@dataclass(frozen=True)
class LatencyRow:
    """One implementation at one batch size. Times in seconds; each ``*_s`` is mean/min/max/p50/p90/p99."""

    name: str  # "attnserve", "transformers" or "vllm"
    batch_size: int
    input_len: int
    output_len: int
    num_iters: int
    ttft_s: dict
    tpot_s: dict
    e2e_s: dict
    batch_latency_s: dict
    # per iteration: (batch latency - the batch's last first token) / (output_len - 1), the decode steps alone;
    # what the baselines' TPOT is (they time the batch's first token and its whole output), so the column that
    # compares engines; a request's own TPOT also holds the other requests' prefill chunks it ran beside
    batch_tpot_s: dict
    output_tokens_per_s: float
    roofline: RooflineRow

    def to_dict(self) -> dict:
        return asdict(self)


def iteration_requests(
    batch_size: int, input_len: int, output_len: int, vocab_size: int, seed: int, iteration: int
) -> list[BenchRequest]:
    """The prompts of one iteration (the same for the engine and the baseline)."""
    return random_requests(batch_size, input_len, output_len, 0.0, vocab_size, seed * 1_000_003 + iteration)


def _row(
    name: str,
    batch_size: int,
    input_len: int,
    output_len: int,
    ttfts: list[float],
    tpots: list[float],
    e2es: list[float],
    batch_latencies: list[float],
    roofline: Roofline,
    batch_tpots: list[float] | None = None,
) -> LatencyRow:
    contexts = [mean_decode_context(input_len, output_len)] * batch_size
    tpot = summarize(tpots)
    limit = roofline.step_limit_s(contexts)
    return LatencyRow(
        name=name,
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        num_iters=len(batch_latencies),
        ttft_s=summarize(ttfts),
        tpot_s=tpot,
        e2e_s=summarize(e2es),
        batch_latency_s=summarize(batch_latencies),
        batch_tpot_s=summarize(tpots if batch_tpots is None else batch_tpots),
        output_tokens_per_s=batch_size * output_len * len(batch_latencies) / sum(batch_latencies),
        roofline=roofline.row(limit, tpot["mean"], step_bytes=roofline.step_bytes(contexts)),
    )


def _tpot(ttft: float, e2e: float, output_len: int) -> float | None:
    return (e2e - ttft) / (output_len - 1) if output_len > 1 else None


def run_engine(
    engine,
    batch_size: int,
    input_len: int,
    output_len: int,
    num_iters: int,
    num_iters_warmup: int,
    vocab_size: int,
    seed: int,
    roofline: Roofline,
    bar=None,
    sampling: dict | None = None,
) -> LatencyRow:
    """Timed batches through the engine; per-request TTFT/TPOT/E2E from the engine's request metrics.
    ``sampling``: more SamplingParams fields for every request (penalties), on top of greedy, ignore_eos."""
    from attnserve.core.sampling_params import SamplingParams

    device = engine.info.device
    ttfts, tpots, e2es, batches, batch_tpots = [], [], [], [], []
    for it in range(num_iters_warmup + num_iters):
        requests = iteration_requests(batch_size, input_len, output_len, vocab_size, seed, it)
        with frozen_heap():  # no full-collection pause inside the timed batch (gc_heap.py)
            t0 = now(device)
            # detokenize=False: the benchmark counts tokens, so no per-token decoding in the timed loop
            params = SamplingParams(
                temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False, **(sampling or {})
            )
            for r in requests:
                engine.add_request(r.prompt_token_ids, params)
            finished = []
            while engine.has_unfinished_requests():
                finished += [o for o in engine.step() if o.finished]
            batch_latency = now(device) - t0
        if bar is not None:
            bar.update(1)
        if it < num_iters_warmup:
            continue
        batches.append(batch_latency)
        last_first_token = max(o.metrics.ttft for o in finished)
        if output_len > 1:
            batch_tpots.append((batch_latency - last_first_token) / (output_len - 1))
        for o in finished:
            assert len(o.outputs[0].token_ids) == output_len, "a request stopped early"
            ttfts.append(o.metrics.ttft)
            e2es.append(o.metrics.e2e)
            tpot = _tpot(o.metrics.ttft, o.metrics.e2e, output_len)
            if tpot is not None:
                tpots.append(tpot)
    return _row("attnserve", batch_size, input_len, output_len, ttfts, tpots, e2es, batches, roofline, batch_tpots)


def run_transformers(
    baseline,
    batch_size: int,
    input_len: int,
    output_len: int,
    num_iters: int,
    num_iters_warmup: int,
    vocab_size: int,
    seed: int,
    roofline: Roofline,
    bar=None,
) -> LatencyRow:
    """The same prompts as one static batch through transformers' ``generate``."""
    ttfts, tpots, e2es = [], [], []
    for it in range(num_iters_warmup + num_iters):
        prompts = [
            r.prompt_token_ids for r in iteration_requests(batch_size, input_len, output_len, vocab_size, seed, it)
        ]
        ttft = baseline.generate(prompts, 1).seconds
        e2e = baseline.generate(prompts, output_len).seconds
        if bar is not None:
            bar.update(1)
        if it < num_iters_warmup:
            continue
        ttfts.append(ttft)
        e2es.append(e2e)
        tpot = _tpot(ttft, e2e, output_len)
        if tpot is not None:
            tpots.append(tpot)
    return _row("transformers", batch_size, input_len, output_len, ttfts, tpots, e2es, e2es, roofline)


def vllm_row(result: dict, input_len: int, output_len: int, roofline: Roofline) -> LatencyRow:
    """One batch size of the vLLM runner's result: whole-batch TTFT (one token) and E2E per iteration, TPOT from
    their difference, as the transformers rows."""
    ttfts, e2es = result["ttft_s"], result["e2e_s"]
    tpots = [t for t in (_tpot(a, b, output_len) for a, b in zip(ttfts, e2es)) if t is not None]
    return _row("vllm", result["batch_size"], input_len, output_len, ttfts, tpots, e2es, e2es, roofline)


def format_table(rows: list[LatencyRow]) -> str:
    """The short table printed last: medians, tokens/s and % of the roofline."""
    head = (
        f"{'':<13} {'batch':>5} {'TTFT p50 ms':>11} {'TPOT p50 ms':>11} {'TPOT p99 ms':>11} "
        f"{'batch TPOT ms':>13} {'E2E p50 s':>9} {'output tok/s':>12} {'% of limit':>10}"
    )
    lines = [head]

    def ms(x: float | None, width: int) -> str:  # "-" where there is no value (no TPOT at --output-len 1)
        return f"{'-':>{width}}" if x is None else f"{1e3 * x:>{width}.2f}"

    for r in rows:
        pct = r.roofline.pct_of_limit
        pct_text = f"{'-':>9} " if pct is None else f"{pct:>9.1f}%"
        lines.append(
            f"{r.name:<13} {r.batch_size:>5} {ms(r.ttft_s['p50'], 11)} {ms(r.tpot_s['p50'], 11)} "
            f"{ms(r.tpot_s['p99'], 11)} {ms(r.batch_tpot_s['p50'], 13)} {r.e2e_s['p50']:>9.3f} "
            f"{r.output_tokens_per_s:>12.1f} {pct_text}"
        )
    return "\n".join(lines)


def _check_sizes(config, sizes: list[int]) -> None:
    """ValueError for a tensor-parallel size the model's heads cannot split, from its config alone."""
    from attnserve.distributed.sharding import check_tensor_parallel_size
    from attnserve.model_executor.loader import load_hf_config, resolve_model

    hf_config = load_hf_config(resolve_model(config.model))
    for tp in sizes:
        check_tensor_parallel_size(hf_config, tp)


def run_latency(
    config,
    *,
    batch_sizes: list[int],
    input_len: int,
    output_len: int,
    num_iters: int,
    num_iters_warmup: int,
    baseline: str | None = None,
    progress: bool = True,
    tensor_parallel_sizes: list[int] | None = None,
    sampling: dict | None = None,
) -> dict:
    """The whole benchmark over ``batch_sizes``: the engine's rows, then the baseline's; JSON-ready result.

    ``tensor_parallel_sizes``: run the engine once per size, one after the other (rows ``attnserve tpN``);
    default: the config's size only. ``sampling``: SamplingParams fields every engine request adds (penalties;
    the baseline runs without them). Raises ValueError when input_len + output_len exceeds max_model_len.
    """
    import dataclasses

    from tqdm import tqdm

    from attnserve.benchmarks.offline import (
        check_lengths,
        check_requests_fit,
        start_baseline,
        start_engine,
        stop_engine,
    )

    seed = config.model.seed
    if baseline == "vllm":
        from attnserve.benchmarks.vllm_baseline import check_vllm_baseline

        check_vllm_baseline(config.model.model)
    elif baseline == "transformers":
        from attnserve.benchmarks.hf_baseline import check_transformers_baseline

        check_transformers_baseline(config.model.model, config.model.load_format)
    sizes = tensor_parallel_sizes or [config.parallel.tensor_parallel_size]
    _check_sizes(config, sizes)  # every size before the first run: not a ValueError after tp1's whole run
    iters = len(batch_sizes) * (num_iters + num_iters_warmup)
    rows, first = [], None
    for tp in sizes:
        cfg = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, tensor_parallel_size=tp))
        engine, facts, roofline = start_engine(cfg)
        check_lengths(input_len, output_len, facts.max_model_len, ["--input-len", "--output-len"])
        check_requests_fit(engine, input_len)
        first = first or (facts, roofline)
        args = (input_len, output_len, num_iters, num_iters_warmup, facts.prompt_vocab_size, seed, roofline)
        name = "attnserve" if tensor_parallel_sizes is None else f"attnserve tp{tp}"
        with tqdm(total=iters, desc=name, unit="batch", disable=not progress) as bar:
            rows += [
                dataclasses.replace(run_engine(engine, b, *args, bar=bar, sampling=sampling), name=name)
                for b in batch_sizes
            ]
        stop_engine(engine, facts)
        del engine
    facts, roofline = first
    ratios = vllm_settings = None
    if baseline == "vllm":
        from attnserve.benchmarks.vllm_baseline import latency_spec, run_vllm

        result = run_vllm(
            latency_spec(
                facts,
                batch_sizes=batch_sizes,
                input_len=input_len,
                output_len=output_len,
                num_iters=num_iters,
                num_iters_warmup=num_iters_warmup,
                seed=seed,
                tensor_parallel_size=sizes[0],
            )
        )
        vllm_settings = {"vllm_version": result["vllm_version"], **result["settings"]}
        theirs = [vllm_row(r, input_len, output_len, roofline) for r in result["rows"]]
    elif baseline:
        hf = start_baseline(baseline, facts)
        with tqdm(total=iters, desc="transformers", unit="batch", disable=not progress) as bar:
            theirs = [run_transformers(hf, b, *args, bar=bar) for b in batch_sizes]
        hf.close()
    if baseline:
        ratios = {
            str(o.batch_size): o.output_tokens_per_s / t.output_tokens_per_s for o, t in zip(rows, theirs)
        }  # first size's rows
        rows += theirs
    return {
        "kind": "latency",
        "engine": facts.to_dict(),
        "workload": {
            "batch_sizes": batch_sizes,
            "input_len": input_len,
            "output_len": output_len,
            "num_iters": num_iters,
            "num_iters_warmup": num_iters_warmup,
            "seed": seed,
            "ignore_eos": True,
            "temperature": 0.0,
            "tensor_parallel_sizes": sizes,
            "sampling": sampling or {},
        },
        "roofline": roofline.to_dict(),
        "baseline": baseline,
        "baseline_settings": vllm_settings,  # vllm: its version and what its defaults resolved to
        "ratio_vs_baseline": ratios,  # per batch size: attnserve output tok/s / the baseline's output tok/s
        "results": [r.to_dict() for r in rows],
        "table": format_table(rows),
    }
