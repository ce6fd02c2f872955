"""Host overhead of the engine's step loop: where a decode step's wall time goes besides the model.

    PYTHONPATH=. python benchmarks/host_overhead.py [--num-requests 256] [--input-len 100] [--output-len 100]
                                                   [--vocab-size 4096] [--detokenize] [--profile]
    PYTHONPATH=. python benchmarks/host_overhead.py --device cuda --shape qwen3-0.6b --input-len 562 --output-len 300

Runs the engine with dummy weights and the default model's tokenizer, by default on the CPU with a tiny
Qwen3 (1 layer, hidden 64; ``--shape qwen3-0.6b``: Qwen3-0.6B's dimensions), on ``num_requests`` prompts of
``input_len`` random tokens, each generating exactly ``output_len`` tokens (greedy, ``ignore_eos``), and
times every ``LLMEngine.step`` and its parts with ``time.perf_counter``:

    schedule   Scheduler.schedule
    prepare    ModelRunner.prepare (SchedulerOutput -> ForwardBatch: numpy, metadata build)
    forward    the model's forward pass and logits (execute - prepare - sample - its own bookkeeping)
    sample     the Sampler
    update     Scheduler.update (append tokens, stop checks, free blocks)
    output     OutputProcessor.process (RequestOutputs, detokenization, stop strings)
    other      step - all of the above (engine bookkeeping, ModelRunner.execute's own lines)
    outside    step - executor.execute: schedule + update + output + other
    gc         Python's garbage collector, wherever it ran (already inside the parts above)

Reported over the steps in which all ``num_requests`` requests decode (one token each): each part's median
and mean, and host = step - forward (everything a faster accelerator would not shrink) as its median, its
mean, and the sum of the host parts' medians (robust to a busy machine, whose stalls land in random
parts). On CUDA the forward pass is asynchronous: ``forward`` is only its launch time and ``sample`` waits
for the GPU (its one copy of the token ids), so read ``outside`` and ``prepare`` there. ``--profile`` adds
cProfile's top functions over those steps, model forward included. Detokenization is off by default, as in
``attnserve bench throughput``; ``--detokenize`` turns it on.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import random
import statistics
import tempfile
import time
from collections import defaultdict

import torch

PARTS = ("schedule", "prepare", "forward", "sample", "update", "output", "other", "outside", "gc")
HOST_PARTS = ("schedule", "prepare", "sample", "update", "output", "other")


def write_qwen3(path: str, shape: str, vocab_size: int, max_len: int) -> str:
    """A config.json of a Qwen3: ``tiny`` (1 layer, hidden 64) or ``qwen3-0.6b`` (Qwen3-0.6B's dimensions)."""
    from transformers import Qwen3Config

    if shape == "tiny":
        dims = dict(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=False,
        )
    else:
        dims = dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=True,
        )
    config = Qwen3Config(**dims, max_position_embeddings=max_len)
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(path)
    return path


_NONE = object()


class Timer:
    """Wraps bound methods so that each call's seconds add to ``self.now[name]``; with ``cpu``, the calling
    thread's CPU seconds (``time.thread_time``) also add to ``self.now["cpu:" + name]``."""

    def __init__(self, cpu: bool = False) -> None:
        self.now: dict[str, float] = defaultdict(float)
        self.cpu = cpu
        self._replaced: list[tuple[object, str, object]] = []  # (obj, attr, its own attribute before, or _NONE)

    def replace(self, obj, attr: str, fn) -> None:
        """``obj.attr = fn``, undone by :meth:`unwrap`."""
        self._replaced.append((obj, attr, vars(obj).get(attr, _NONE)))
        setattr(obj, attr, fn)

    def unwrap(self) -> None:
        """Undo every :meth:`wrap` and :meth:`replace`, last first: the objects run untimed again."""
        while self._replaced:
            obj, attr, before = self._replaced.pop()
            if before is _NONE:
                delattr(obj, attr)
            else:
                setattr(obj, attr, before)

    def wrap(self, obj, attr: str, name: str) -> None:
        fn = getattr(obj, attr)
        now, cpu_name = self.now, ("cpu:" + name) if self.cpu else None

        def timed(*args, **kwargs):
            t = time.perf_counter()
            c = time.thread_time() if cpu_name else 0.0
            try:
                return fn(*args, **kwargs)
            finally:
                now[name] += time.perf_counter() - t
                if cpu_name:
                    now[cpu_name] += time.thread_time() - c

        self.replace(obj, attr, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=100)
    ap.add_argument("--vocab-size", type=int, default=4096, help="of the tiny shape")
    ap.add_argument("--shape", choices=("tiny", "qwen3-0.6b"), default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokenizer", default=None, help="folder or hub id (default: the default model's)")
    ap.add_argument("--detokenize", action="store_true", help="detokenize outputs (default: token ids only)")
    ap.add_argument("--profile", action="store_true", help="cProfile the all-decode steps")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: less noise from the model's ops)")
    ap.add_argument("--output-json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from attnserve import LLM, SamplingParams
    from attnserve.model_executor.loader import default_model_path

    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="host_overhead_")
    model = write_qwen3(tmp, args.shape, args.vocab_size, args.input_len + args.output_len + 16)
    on_cpu = args.device == "cpu"
    device_args = (
        dict(dtype="float32", attention_backend="CPU_ATTN", kv_cache_memory=256 << 20)
        if on_cpu
        else dict(dtype="bfloat16")
    )
    llm = LLM(
        model,
        tokenizer=args.tokenizer or default_model_path(),
        load_format="dummy",
        device=args.device,
        max_num_seqs=args.num_requests,
        **device_args,
    )
    prompt_vocab = min(llm.engine.hf_config.vocab_size, len(llm.tokenizer))
    engine = llm.engine
    runner = engine.runner

    timer = Timer()
    gc_start = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            timer.now["gc"] += time.perf_counter() - gc_start[0]

    gc.callbacks.append(on_gc)
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine.scheduler, "update", "update")
    timer.wrap(engine.output_processor, "process", "output")
    timer.wrap(engine.executor, "execute", "execute")
    import attnserve.model_executor.model_runner as mr

    timer.wrap(mr, "host_batch", "prepare")  # the step's host batch (the device copies follow in _hidden)
    timer.wrap(runner.sampler, "sample", "sample")

    rng = random.Random(0)
    extra = {} if args.detokenize else {"detokenize": False}
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, **extra)
    engine.add_request([1, 2, 3], params)  # warm-up
    while engine.has_unfinished_requests():
        engine.step()
    for _ in range(args.num_requests):
        prompt = [rng.randrange(prompt_vocab) for _ in range(args.input_len)]
        engine.add_request(
            prompt, SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True, **extra)
        )

    prof = cProfile.Profile() if args.profile else None
    decode_steps: list[dict[str, float]] = []
    num_steps = 0
    t_all = time.perf_counter()
    while engine.has_unfinished_requests():
        timer.now.clear()
        decoding = (
            len(engine.scheduler.running) == args.num_requests
            and not engine.scheduler.waiting
            and all(r.num_computed_tokens == r.num_tokens - 1 for r in engine.scheduler.running)
        )
        if prof is not None and decoding:
            prof.enable()
        t = time.perf_counter()
        engine.step()
        step = time.perf_counter() - t
        if prof is not None and decoding:
            prof.disable()
        num_steps += 1
        if not decoding:
            continue
        n = dict(timer.now)
        parts = {
            "step": step,
            "schedule": n["schedule"],
            "prepare": n["prepare"],
            "sample": n["sample"],
            "update": n["update"],
            "output": n["output"],
            "gc": n.get("gc", 0.0),
        }
        parts["forward"] = n["execute"] - n["prepare"] - n["sample"]  # includes execute's own few lines
        parts["other"] = step - n["execute"] - n["schedule"] - n["update"] - n["output"]
        parts["host"] = step - parts["forward"]
        parts["outside"] = step - n["execute"]
        decode_steps.append(parts)
    total = time.perf_counter() - t_all

    med = {k: statistics.median(s[k] for s in decode_steps) * 1e3 for k in decode_steps[0]}
    mean = {k: statistics.mean(s[k] for s in decode_steps) * 1e3 for k in decode_steps[0]}
    med["host_sum_of_medians"] = sum(med[k] for k in HOST_PARTS)
    print(
        f"{args.num_requests} requests, input {args.input_len}, output {args.output_len}, shape {args.shape} "
        f"(vocab {engine.hf_config.vocab_size}), {args.device} ({engine.info.backend_name}), "
        f"detokenize {args.detokenize}, torch threads {torch.get_num_threads()}"
    )
    print(f"{num_steps} steps in {total:.2f} s; {len(decode_steps)} all-decode steps, ms per step:")
    print(f"  {'':<9} {'median':>8} {'mean':>8}")
    for k in ("step",) + PARTS + ("host",):
        print(f"  {k:<9} {med[k]:8.3f} {mean[k]:8.3f}")
    print(f"  host = sum of the host parts' medians: {med['host_sum_of_medians']:.3f}")
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(
                {"args": vars(args), "median_ms": med, "mean_ms": mean, "num_decode_steps": len(decode_steps)},
                f,
                indent=1,
            )
    engine.shutdown()
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
