"""The vLLM side of ``--baseline vllm``, run as ``python -m attnserve.benchmarks.vllm_runner SPEC OUT``.

A subprocess of its own, so that vLLM has the GPU to itself after attnserve's engine has run and exited its
memory, and so that vLLM's imports (its own torch.compile caches, CUDA context, engine-core process) never touch
the attnserve process. ``SPEC`` is the JSON that :mod:`attnserve.benchmarks.vllm_baseline` writes; ``OUT`` gets
the JSON result.

Both workloads run through ``vllm.LLM.generate`` exactly as vLLM's own benchmark entry points do
(``vllm/benchmarks/throughput.py`` times one ``generate`` of all requests after a warm-up,
``vllm/benchmarks/latency.py`` times whole batches), with the same token ids, lengths and sampling as
attnserve's run: greedy, ``ignore_eos``, no detokenization (vLLM's own CLI samples at temperature 1.0).
Everything else is vLLM's default (torch.compile, CUDA graphs, its attention backend choice, chunked prefill,
async scheduling, prefix caching), except prefix caching in the latency runs, which time the same prompts
twice (one token, then the whole output) and would otherwise find the first run's blocks.
"""

from __future__ import annotations

import json
import sys
import time


def _settings(llm) -> dict:
    """What vLLM chose, read from its resolved config (names differ between releases: each read is guarded)."""
    cfg = llm.llm_engine.vllm_config
    read = {
        "compilation_mode": lambda: str(cfg.compilation_config.mode),
        "cudagraph_mode": lambda: str(cfg.compilation_config.cudagraph_mode),
        "attention_backend": lambda: str(getattr(cfg, "attention_config").backend),
        "enable_prefix_caching": lambda: bool(cfg.cache_config.enable_prefix_caching),
        "max_num_batched_tokens": lambda: int(cfg.scheduler_config.max_num_batched_tokens),
        "max_num_seqs": lambda: int(cfg.scheduler_config.max_num_seqs),
        "async_scheduling": lambda: bool(cfg.scheduler_config.async_scheduling),
        "chunked_prefill": lambda: bool(cfg.scheduler_config.enable_chunked_prefill),
        "gpu_memory_utilization": lambda: float(cfg.cache_config.gpu_memory_utilization),
        "num_gpu_blocks": lambda: int(cfg.cache_config.num_gpu_blocks),
        "block_size": lambda: int(cfg.cache_config.block_size),
    }
    out = {}
    for name, get in read.items():
        try:
            out[name] = get()
        except Exception:  # noqa: BLE001 - a field this vLLM release does not have
            out[name] = None
    return out


def _llm(engine: dict, enable_prefix_caching: bool | None):
    from vllm import LLM

    kwargs = dict(
        model=engine["model"],
        skip_tokenizer_init=True,
        load_format=engine["load_format"],
        dtype=engine["dtype"],
        max_model_len=engine["max_model_len"],
        max_num_seqs=engine["max_num_seqs"],
        seed=engine["seed"],
        tensor_parallel_size=engine["tensor_parallel_size"],
    )
    if enable_prefix_caching is not None:
        kwargs["enable_prefix_caching"] = enable_prefix_caching
    return LLM(**kwargs)


def _params(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)


def run_throughput(spec: dict) -> dict:
    """All requests in one ``generate``, timed as vllm/benchmarks/throughput.py times it."""
    llm = _llm(spec["engine"], None)
    reqs = spec["requests"]  # [[prompt token ids, output length], ...]
    warm = reqs[0][0][:16]
    llm.generate([{"prompt_token_ids": warm}], _params(2), use_tqdm=False)
    prompts = [{"prompt_token_ids": ids} for ids, _ in reqs]
    params = [_params(n) for _, n in reqs]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"elapsed_s": elapsed, "output_tokens": generated, "settings": _settings(llm)}


def run_latency(spec: dict) -> dict:
    """Per batch size and iteration: the batch's time to one token (TTFT) and to all its tokens (E2E)."""
    from attnserve.benchmarks.latency import iteration_requests

    lat = spec["latency"]
    llm = _llm(spec["engine"], False)
    rows = []
    for b in lat["batch_sizes"]:
        ttfts, e2es = [], []
        for it in range(lat["num_iters_warmup"] + lat["num_iters"]):
            reqs = iteration_requests(b, lat["input_len"], lat["output_len"], lat["vocab_size"], lat["seed"], it)
            prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in reqs]
            times = []
            for max_tokens in (1, lat["output_len"]):
                start = time.perf_counter()
                llm.generate(prompts, _params(max_tokens), use_tqdm=False)
                times.append(time.perf_counter() - start)
            if it >= lat["num_iters_warmup"]:
                ttfts.append(times[0])
                e2es.append(times[1])
        rows.append({"batch_size": b, "ttft_s": ttfts, "e2e_s": e2es})
    return {"rows": rows, "settings": _settings(llm)}


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    import vllm

    result = run_throughput(spec) if spec["kind"] == "throughput" else run_latency(spec)
    result["vllm_version"] = vllm.__version__
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
