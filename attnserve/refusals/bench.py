"""The words of ``attnserve bench``'s refusals: flags that contradict each other, a baseline that cannot run here,
benchmark requests that do not fit the model, a server that cannot be asked.

``entrypoints/cli/bench.py``, ``bench_serve.py`` and ``benchmarks/`` raise (or print) with these. A flag's refusal
is placed at the flag (``origin``), as every command line's is.
"""

from __future__ import annotations

from attnserve.refusals import NO_VALUE, Refusal

PLOT_NEEDS_MATPLOTLIB = "--plot needs matplotlib: pip install 'attnserve[bench]' (or pip install matplotlib)"
SHAPES_RANDOM = "it shapes random prompts"


def at(flag: str, value: object = None, reason: str = "", allowed: str | None = None) -> Refusal:
    """A bench flag's refusal, placed at the flag: ``argument --num-heads: 6 is not a multiple of ...``."""
    return Refusal(
        value=NO_VALUE if value is None else value,
        allowed=allowed,
        reason=reason or None,
        origin=f"argument {flag}",
        names_path=True,
    )


def with_prompts_file(flag: str, value: object, given: str = "--prompts-file") -> Refusal:
    """A random-prompt flag (``--prefix-len``, ``--num-turns``) beside a prompts file (``given``: how it was given)."""
    return at(flag, value, f"not allowed with {given} ({SHAPES_RANDOM})")


def turns_with_baseline(num_turns: int) -> Refusal:
    """More than one turn with a baseline, whose later prompts would hold the engine's answers."""
    return Refusal(
        ("num_turns",),
        num_turns,
        reason="not allowed with --baseline (a later turn's prompt holds the engine's own answer)",
    )


def too_long(max_input: int, max_output: int, max_model_len: int, flags: list[str]) -> Refusal:
    """Requests that do not fit ``max_model_len``; ``flags``: the flags that shape them (``--prefix-len`` too when
    a prefix lengthens every prompt)."""
    return Refusal(
        reason=f"the longest prompt ({max_input} tokens) plus the longest output ({max_output} tokens) "
        f"exceeds max_model_len {max_model_len}",
        advice=f"lower {'/'.join(flags)} or raise --max-model-len",
    )


def heads_not_grouped(num_heads: int, num_kv_heads: int) -> Refusal:
    return at("--num-heads", num_heads, f"is not a multiple of --num-kv-heads {num_kv_heads}")


def options_unused(fields: list[str], backends: list[str]) -> Refusal:
    """``bench attention``'s attention-config ``fields`` that none of the timed ``backends`` reads: timing them
    would accept the fields and ignore them."""
    return Refusal(
        ("attention_config",),
        ", ".join(fields),
        reason=f"applies to none of the backends timed ({', '.join(backends)})",
    )


def penalty_with_baseline(field: str, value: float, baseline: str) -> Refusal:
    """A ``bench latency`` penalty beside ``--baseline``, whose runs take no penalty: the ratio would compare
    unlike work."""
    return at(
        f"--{field.replace('_', '-')}", value, f"not allowed with --baseline {baseline} (its runs take no penalty)"
    )


def batch_beyond_max_num_seqs(batch_size: int, max_num_seqs: int) -> Refusal:
    """A ``bench latency`` batch larger than the engine runs at once: its requests would queue, and the row would
    time the queue under a batch size that never ran."""
    return at(
        "--batch-size",
        batch_size,
        f"more than --max-num-seqs {max_num_seqs}, the requests the engine runs at once (the rest would queue)",
        allowed=f"at most {max_num_seqs}, or raise --max-num-seqs",
    )


def nothing_to_time() -> Refusal:
    """``bench attention`` with ``--context-lens`` and ``--prefill-lens`` both given empty."""
    return at("--context-lens", [], "no decode or prefill case left to time (--prefill-lens is empty too)")


def no_backend_runs(backends: list[str], device: str, skipped: dict[str, list[str]]) -> Refusal:
    why = ". ".join(f"{n}: {'; '.join(r)}" for n, r in skipped.items())
    return at("--backends", reason=f"no backend of {', '.join(backends)} can run on {device}: {why}")


def no_usable_backend(device: str) -> str:
    """``bench attention`` with nothing installed that runs here (its table lists why; exit status 1)."""
    return f"no usable backend on {device}"


def simulated_device(device: str) -> Refusal:
    return Refusal(
        ("device",), device, reason="is simulated; bench attention needs a real device (auto, cpu, cuda, cuda:N)"
    )


def baseline_unknown(name: str, baselines: list[str]) -> Refusal:
    return Refusal(("baseline",), name, ", ".join(baselines), reason="not supported")


VLLM_MISSING = Refusal(
    ("baseline",),
    "vllm",
    "a baseline importable in this Python",
    reason="not available: vllm is not installed here",
    advice="pip install vllm",
)


TRANSFORMERS_GGUF_NEEDS_ACCELERATE = Refusal(
    ("baseline",),
    "transformers",
    "a baseline importable in this Python",
    reason="not available for a GGUF model: transformers loads a GGUF only with accelerate, not installed here",
    advice="pip install 'attnserve[bench]' (or pip install accelerate)",
)


def vllm_needs_folder(model: str | None) -> Refusal:
    return Refusal(
        ("baseline",),
        "vllm",
        "a --model folder with config.json",
        reason=f"not available for model {model!r}: vLLM is given a Hugging Face folder",
    )


# ---------------------------------------------------------------- bench serve (entrypoints/cli/bench_serve.py)

BASE_URL_WORDS = "an http:// or https:// URL with a host, and a port in [1, 65535] if it names one"
HOST_WORDS = "a host name or IP address"
FILE_NEEDS_PROMPT_FILE = at("--dataset", reason="file needs --prompt-file")
PROMPT_FILE_UNUSED = at(
    "--prompt-file", reason="not used with --dataset random (leave --dataset out, or give --dataset file)"
)


def server_unreachable(url: str, error: Exception) -> str:
    return (
        f"GET {url} failed ({type(error).__name__}: {error}); is the server running there? (--host, --port, --base-url)"
    )


def server_answered(url: str, status: int, body: str) -> str:
    hint = "; pass its key with --api-key" if status == 401 else ""
    return f"GET {url} answered HTTP {status}: {body}{hint}"


def no_model_listed(url: str, body: str) -> str:
    return f"GET {url} listed no model ({body}); name one with --model"
