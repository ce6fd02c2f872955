"""``--baseline vllm``: the same workload through vLLM, in a subprocess, after attnserve's engine has exited.

The subprocess (:mod:`attnserve.benchmarks.vllm_runner`) gets the engine's model folder, dtype, load format,
seed, ``max_model_len``, ``max_num_seqs`` and tensor-parallel size, and the exact requests (throughput) or the
recipe of the exact prompts (latency); vLLM's other settings are its defaults, and the result records what
they resolved to. Refusals come before any model loads (:func:`check_vllm_baseline`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from attnserve.refusals import Refused
from attnserve.refusals.bench import VLLM_MISSING, vllm_needs_folder


def check_vllm_baseline(model: str | None) -> None:
    """Refused (path ``("baseline",)``) when vLLM is not importable here, or the model is not a Hugging Face
    folder (vLLM reads a config.json; the default model and GGUF files are not wired)."""
    if importlib.util.find_spec("vllm") is None:
        raise Refused(VLLM_MISSING)
    if model is None or not os.path.isfile(os.path.join(model, "config.json")):
        raise Refused(vllm_needs_folder(model))


def _engine_spec(facts, tensor_parallel_size: int) -> dict:
    return {
        "model": facts.model,
        "load_format": facts.load_format,
        "dtype": str(facts.dtype).removeprefix("torch."),
        "max_model_len": facts.max_model_len,
        "max_num_seqs": facts.max_num_seqs,
        "seed": facts.seed,
        "tensor_parallel_size": tensor_parallel_size,
    }


def throughput_spec(facts, requests, tensor_parallel_size: int = 1) -> dict:
    """The runner's input for ``bench throughput``: the engine's settings and every request's ids and length."""
    return {
        "kind": "throughput",
        "engine": _engine_spec(facts, tensor_parallel_size),
        "requests": [[list(r.prompt_token_ids), r.output_len] for r in requests],
    }


def latency_spec(
    facts,
    *,
    batch_sizes: list[int],
    input_len: int,
    output_len: int,
    num_iters: int,
    num_iters_warmup: int,
    seed: int,
    tensor_parallel_size: int = 1,
) -> dict:
    """The runner's input for ``bench latency``: what rebuilds each iteration's prompts (``iteration_requests``)."""
    return {
        "kind": "latency",
        "engine": _engine_spec(facts, tensor_parallel_size),
        "latency": {
            "batch_sizes": batch_sizes,
            "input_len": input_len,
            "output_len": output_len,
            "num_iters": num_iters,
            "num_iters_warmup": num_iters_warmup,
            "vocab_size": facts.prompt_vocab_size,
            "seed": seed,
        },
    }


def run_vllm(spec: dict) -> dict:
    """Run the spec in ``python -m attnserve.benchmarks.vllm_runner``; its logs pass through to this process's
    stdout and stderr. Raises RuntimeError when it fails."""
    with tempfile.TemporaryDirectory(prefix="attnserve-vllm-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        proc = subprocess.run([sys.executable, "-m", "attnserve.benchmarks.vllm_runner", spec_path, out_path])
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise RuntimeError(f"the vLLM baseline failed (exit status {proc.returncode}); its log is above")
        with open(out_path) as f:
            return json.load(f)
