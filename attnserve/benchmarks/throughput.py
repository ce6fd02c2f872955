"""``attnserve bench throughput``: offline throughput of a batch of requests through the engine.

All requests are queued at once and the engine steps until every one has generated exactly its output
length (greedy, ``ignore_eos``). Throughput = tokens / wall time of the stepping (model load and one
short warm-up request excluded). With ``baseline="transformers"`` the same requests then run through
transformers' ``generate`` in static batches of ``max_num_seqs`` in request order, each batch generating
its longest output length (what static batching costs); only the requested tokens are counted.

Each row carries the roofline of its own steps (``roofline.py``): every step reads the weights once and
the K/V of each running request's context; limit = those bytes over the copy bandwidth, % = limit / elapsed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from attnserve.benchmarks.requests import BenchRequest
from attnserve.benchmarks.roofline import Roofline, RooflineRow
from attnserve.benchmarks.stats import now

TIMELINE_POINTS = 200  # most (time, tokens) points kept per row for the plot


@dataclass(frozen=True)
class ThroughputRow:
    """One implementation's result on the workload."""

    name: str  # "attnserve" or "transformers"
    num_requests: int
    total_output_tokens: int  # generated tokens that were asked for
    total_tokens: int  # prompt + output tokens
    elapsed_s: float
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    num_steps: int  # forward passes (engine steps, or generate's steps summed over batches)
    roofline: RooflineRow
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds, output tokens so far)

    def to_dict(self) -> dict:
        return asdict(self)


def _row(name: str, requests: list[BenchRequest], out_tokens: int, elapsed: float, steps: int, kv_tokens: int,
         roofline: Roofline, timeline: list[tuple[float, int]]) -> ThroughputRow:
    total = out_tokens + sum(r.input_len for r in requests)
    stride = max(1, len(timeline) // TIMELINE_POINTS)
    return ThroughputRow(
        name=name, num_requests=len(requests), total_output_tokens=out_tokens, total_tokens=total, elapsed_s=elapsed,
        requests_per_s=len(requests) / elapsed, output_tokens_per_s=out_tokens / elapsed,
        total_tokens_per_s=total / elapsed, num_steps=steps,
        roofline=roofline.row(roofline.run_limit_s(steps, kv_tokens), elapsed),
        timeline=timeline[::stride] + ([timeline[-1]] if timeline and (len(timeline) - 1) % stride else []))


def warm_up_engine(engine, requests: list[BenchRequest]) -> None:
    """One short request first, so that one-time costs (allocator, lazy init) stay out of the timing."""
    from attnserve.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, detokenize=False)
    engine.add_request(requests[0].prompt_token_ids[:16], params)
    while engine.has_unfinished_requests():
        engine.step()


def run_engine(engine, requests: list[BenchRequest], roofline: Roofline, progress: bool = True) -> ThroughputRow:
    """Queue every request, step until all finish; count steps and the cached tokens each step reads."""
    from tqdm import tqdm

    from attnserve.engine.sampling_params import SamplingParams

    device = engine.info.device
    warm_up_engine(engine, requests)
    bar = tqdm(total=len(requests), desc="attnserve", unit="req", disable=not progress)
    t0 = now(device)
    for r in requests:
        # detokenize=False: the benchmark counts tokens, so no per-token decoding in the timed loop
        params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True, detokenize=False)
        engine.add_request(r.prompt_token_ids, params)
    steps = kv_tokens = out_tokens = 0
    lengths: dict[str, int] = {}
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
        timeline.append((now(device) - t0, out_tokens))
    elapsed = now(device) - t0
    bar.close()
    return _row("attnserve", requests, out_tokens, elapsed, steps, kv_tokens, roofline, timeline)


def run_transformers(baseline, requests: list[BenchRequest], batch_size: int, roofline: Roofline,
                     progress: bool = True) -> ThroughputRow:
    """Static batches of ``batch_size`` requests in order through ``TransformersBaseline.generate``."""
    from tqdm import tqdm

    baseline.generate([requests[0].prompt_token_ids[:16]], 2)  # warm-up
    bar = tqdm(total=len(requests), desc="transformers", unit="req", disable=not progress)
    elapsed = 0.0
    steps = kv_tokens = out_tokens = 0
    timeline: list[tuple[float, int]] = []
    for i in range(0, len(requests), batch_size):
        batch = requests[i:i + batch_size]
        new = max(r.output_len for r in batch)
        elapsed += baseline.generate([r.prompt_token_ids for r in batch], new).seconds
        steps += new
        # every row runs all `new` steps; step j reads the row's prompt and j earlier tokens
        kv_tokens += new * sum(r.input_len for r in batch) + len(batch) * new * (new - 1) // 2
        out_tokens += sum(r.output_len for r in batch)
        timeline.append((elapsed, out_tokens))
        bar.update(len(batch))
    bar.close()
    return _row("transformers", requests, out_tokens, elapsed, steps, kv_tokens, roofline, timeline)


def format_table(rows: list[ThroughputRow], ratio: float | None) -> str:
    """The short table printed last."""
    head = f"{'':<13} {'requests/s':>10} {'output tok/s':>12} {'total tok/s':>11} {'elapsed s':>9} {'% of limit':>10}"
    lines = [head]
    for r in rows:
        pct = r.roofline.pct_of_limit
        lines.append(f"{r.name:<13} {r.requests_per_s:>10.2f} {r.output_tokens_per_s:>12.1f} "
                     f"{r.total_tokens_per_s:>11.1f} {r.elapsed_s:>9.2f} {pct:>9.1f}%")
    if ratio is not None:
        lines.append(f"attnserve / transformers (output tok/s): {ratio:.2f}x")
    return "\n".join(lines)


def run_throughput(config, *, num_prompts: int | None, input_len: int, output_len: int, range_ratio: float,
                   prompts_file: str | None = None, baseline: str | None = None, progress: bool = True) -> dict:
    """The whole benchmark: requests, the engine's row, the baseline's row; the JSON-ready result.

    Raises ValueError (requests that do not fit max_model_len), PromptsFileError (a ValueError: a prompts file
    that is not UTF-8 text or has no prompts; before the model loads) and OSError (file).
    """
    from attnserve.benchmarks.offline import check_lengths, check_requests_fit, start_baseline, start_engine, stop_engine
    from attnserve.benchmarks.requests import PromptsFileError, file_requests, random_requests, read_prompts_file

    seed = config.model.seed
    texts = read_prompts_file(prompts_file) if prompts_file else None
    if texts == []:
        raise PromptsFileError(f"{prompts_file} has no prompts (give one prompt per line, or leave --prompts-file out "
                               "for random prompts)")
    engine, facts, roofline = start_engine(config)
    if texts:
        requests = file_requests([engine.check_prompt(t) for t in texts], num_prompts, output_len, range_ratio, seed)
    else:
        requests = random_requests(num_prompts or 1000, input_len, output_len, range_ratio, facts.prompt_vocab_size, seed)
    check_lengths(max(r.input_len for r in requests), max(r.output_len for r in requests), facts.max_model_len)
    check_requests_fit(engine, max(r.input_len for r in requests))

    rows = [run_engine(engine, requests, roofline, progress)]
    stop_engine(engine, facts)
    del engine
    if baseline:
        hf = start_baseline(baseline, facts)
        rows.append(run_transformers(hf, requests, facts.max_num_seqs, roofline, progress))
        hf.close()
    ratio = rows[0].output_tokens_per_s / rows[1].output_tokens_per_s if baseline else None
    return {
        "kind": "throughput",
        "engine": facts.to_dict(),
        "workload": {
            "num_prompts": len(requests), "input_len": input_len, "output_len": output_len, "range_ratio": range_ratio,
            "seed": seed, "prompts_file": prompts_file, "ignore_eos": True, "temperature": 0.0,
            "total_input_tokens": sum(r.input_len for r in requests),
            "total_output_tokens": sum(r.output_len for r in requests),
            "input_lens": [r.input_len for r in requests], "output_lens": [r.output_len for r in requests],
        },
        "roofline": roofline.to_dict(),
        "baseline": baseline,
        "ratio_vs_baseline": ratio,
        "results": [r.to_dict() for r in rows],
        "table": format_table(rows, ratio),
    }
