"""``attnserve generate``: run prompts through the engine and stream the text to the terminal."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from attnserve.refusals import Refusal, Refused, message
from attnserve.refusals.cli import (
    DEFAULT_PROMPT_ADVICE,
    LOGIT_BIAS,
    THE_DEFAULT_PROMPT,
    at_argument,
    at_flag,
    logprobs_need_output_json,
    no_prompts,
    unreadable_file,
)

DEFAULT_PROMPT = "What are the three primary colors? Answer in one sentence."
# the sampling flags' values when neither the command line nor the generation config (--generation-config) sets them
GENERATE_DEFAULTS = {
    "max_tokens": 128,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}


def add_parser(subparsers) -> None:
    from attnserve.core.sampling_params import ALLOWED
    from attnserve.entrypoints.cli.arg_types import output_file, typed
    from attnserve.entrypoints.cli.chat_args import add_chat_template_args
    from attnserve.entrypoints.cli.engine_args import add_engine_args

    p = subparsers.add_parser(
        "generate",
        help="generate text for prompts (default model and prompt when none are given)",
        description="Generate text with the engine. With no --prompt, asks the default prompt as a chat.",
    )
    add_engine_args(p)
    g = p.add_argument_group("prompts and sampling")
    g.add_argument("--prompt", action="append", default=None, help="a prompt (repeat for several)")
    g.add_argument(
        "--prompts-file",
        default=None,
        help='a text file with one prompt per line (blank lines skipped), or JSONL with a "prompt" '
        "string per line, as bench throughput and bench serve read it",
    )
    g.add_argument(
        "--chat", action="store_true", help="wrap each prompt in the model's chat template (or --chat-template's)"
    )
    # the sampling flags' ranges are SamplingParams' (checked when it is built); their types are checked here
    # left out: the generation config's value (--generation-config), else GENERATE_DEFAULTS
    g.add_argument(
        "--max-tokens",
        type=typed(int, ALLOWED["max_tokens"]),
        default=None,
        help="most tokens to generate per prompt (>= 1; default 128, at most the generation config's max_new_tokens)",
    )
    g.add_argument(
        "--temperature",
        type=typed(float, ALLOWED["temperature"]),
        default=None,
        help="0 = greedy (default, unless the generation config sets one)",
    )
    g.add_argument(
        "--top-p",
        type=typed(float, ALLOWED["top_p"]),
        default=None,
        help="nucleus sampling mass in (0, 1] (default 1, or the generation config's)",
    )
    g.add_argument(
        "--top-k",
        type=typed(int, ALLOWED["top_k"]),
        default=None,
        help="keep the k most likely tokens; 0 = all (default, or the generation config's)",
    )
    g.add_argument(
        "--min-p",
        type=typed(float, ALLOWED["min_p"]),
        default=None,
        help="drop tokens below min_p x the top probability (default 0, or the generation config's)",
    )
    g.add_argument("--stop", action="append", default=[], help="stop string (repeat for several)")
    g.add_argument("--n", type=typed(int, ALLOWED["n"]), default=1, help="completions per prompt")
    g.add_argument(
        "--logprobs",
        type=typed(int, ALLOWED["logprobs"]),
        default=None,
        help="top logprobs per generated token (in --output-json, which it needs)",
    )
    g.add_argument("--ignore-eos", action="store_true", help="keep generating after EOS")
    add_chat_template_args(p, serve=False)
    g.add_argument(
        "--presence-penalty",
        type=typed(float, ALLOWED["presence_penalty"]),
        default=0.0,
        help="subtracted from the logit of every token already generated, in [-2, 2]",
    )
    g.add_argument(
        "--frequency-penalty",
        type=typed(float, ALLOWED["frequency_penalty"]),
        default=0.0,
        help="subtracted from a token's logit once per time it was generated, in [-2, 2]",
    )
    g.add_argument(
        "--repetition-penalty",
        type=typed(float, ALLOWED["repetition_penalty"]),
        default=None,
        help="> 1 discourages tokens of the prompt and output (vLLM's; 1 = off)",
    )
    g.add_argument(
        "--min-tokens",
        type=typed(int, ALLOWED["min_tokens"]),
        default=0,
        help="generate at least this many tokens before EOS or a stop",
    )
    g.add_argument("--bad-words", action="append", default=None, metavar="WORD", help="never generate WORD (repeat)")
    g.add_argument(
        "--allowed-token-ids",
        type=typed(int, "token ids"),
        nargs="+",
        default=None,
        metavar="ID",
        help="generate only these token ids",
    )
    g.add_argument(
        "--logit-bias", action="append", default=None, metavar="ID=BIAS", help="add BIAS to token ID's logit (repeat)"
    )
    g.add_argument(
        "--include-stop-str-in-output", action="store_true", help="keep the stop string that ended the text in it"
    )
    g.add_argument(
        "--prompt-logprobs",
        type=typed(int, ALLOWED["prompt_logprobs"]),
        default=None,
        help="top logprobs per prompt token (in --output-json, which it needs)",
    )
    g.add_argument(
        "--truncate-prompt-tokens",
        type=typed(int, ALLOWED["truncate_prompt_tokens"]),
        default=None,
        help="keep only the prompt's last N tokens (-1: max_model_len)",
    )
    g.add_argument(
        "--output-json",
        type=output_file,
        default=None,
        metavar="FILE",
        help="write every request's prompt, text, tokens and timings here",
    )
    p.set_defaults(func=run)


def _error(message: str) -> int:
    print(f"attnserve generate: error: {message}", file=sys.stderr)
    return 2


def _prompts(args: argparse.Namespace) -> tuple[list[str], bool]:
    from attnserve.benchmarks.requests import PromptsFileError, read_prompts_file
    from attnserve.engine.request_checks import RequestValueError, check_not_empty

    prompts = list(args.prompt or [])
    if args.prompts_file:
        try:  # the format bench throughput and bench serve read: one prompt a line, or JSONL's "prompt"
            from_file = read_prompts_file(args.prompts_file)
        except PromptsFileError as e:  # not UTF-8 text, a bad JSONL line
            raise Refused(at_flag(e.refusal, "--prompts-file")) from None
        if not from_file:  # not the default prompt instead: the file named is likely the wrong one
            raise Refused(
                at_flag(no_prompts(args.prompts_file, "--prompts-file", THE_DEFAULT_PROMPT), "--prompts-file")
            )
        prompts += from_file
    if not prompts:
        return [DEFAULT_PROMPT], True
    for p in prompts:  # the words of every surface's empty prompt (request_checks), and this command's way out
        try:
            check_not_empty(p)
        except RequestValueError as e:
            raise Refused(at_argument(replace(e.refusal, advice=DEFAULT_PROMPT_ADVICE), "--prompt")) from None
    return prompts, args.chat


def _logit_bias(items: list[str] | None) -> dict[int, float] | None:
    """``--logit-bias ID=BIAS`` flags as a dict; ValueError naming the flag for one that is not ID=BIAS."""
    if not items:
        return None
    out = {}
    for item in items:
        token, sep, bias = item.partition("=")
        try:
            out[int(token)] = float(bias)
        except ValueError:
            sep = ""
        if not sep:
            raise Refused(at_argument(Refusal(("logit_bias",), item, LOGIT_BIAS), "--logit-bias"))
    return out


def run(args: argparse.Namespace) -> int:
    from attnserve.entrypoints.cli.engine_args import engine_config_from_args, error_line

    config = engine_config_from_args(args)
    for name in ("logprobs", "prompt_logprobs"):  # the terminal shows text only: without a file they would be lost
        if getattr(args, name) is not None and not args.output_json:
            return _error(message(at_argument(logprobs_need_output_json(name, getattr(args, name)), name)))
    from attnserve.core.sampling_params import SamplingParams, SamplingParamsError

    given = {name: getattr(args, name) for name in GENERATE_DEFAULTS if getattr(args, name) is not None}
    try:
        params = SamplingParams(
            n=args.n,
            **{**GENERATE_DEFAULTS, **given},
            stop=args.stop,
            logprobs=args.logprobs,
            ignore_eos=args.ignore_eos,
            presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty,
            min_tokens=args.min_tokens,
            bad_words=args.bad_words,
            allowed_token_ids=args.allowed_token_ids,
            logit_bias=_logit_bias(args.logit_bias),
            include_stop_str_in_output=args.include_stop_str_in_output,
            prompt_logprobs=args.prompt_logprobs,
            truncate_prompt_tokens=args.truncate_prompt_tokens,
        )
        prompts, chat = _prompts(args)
    except SamplingParamsError as e:  # the flag names the parameter: the value and what is allowed
        return _error(message(at_argument(e.refusal, e.name)))
    except OSError as e:
        return _error(message(unreadable_file("--prompts-file", args.prompts_file, e.strerror)))
    except ValueError as e:
        return _error(str(e))

    from attnserve.engine.request_checks import MaxTokensTooLargeError

    try:
        outputs, stats = generate_to_terminal(
            config,
            prompts,
            params,
            chat or args.chat_template is not None,
            sys.stdout,
            sys.stderr,
            given=set(given),
            chat_template=args.chat_template,
        )
    except MaxTokensTooLargeError as e:  # a prompt that fits, but not with --max-tokens more (the server's words)
        return _error(message(at_argument(e.refusal, "--max-tokens")))
    except SamplingParamsError as e:  # what the engine refuses of them (--logprobs over --max-logprobs)
        return _error(message(at_argument(e.refusal, e.name)))
    except (ValueError, FileNotFoundError) as e:  # unknown model, bad architecture, prompt too long, ...
        return _error(error_line(args, e))
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({"stats": stats, "requests": [o.to_dict() for o in outputs]}, f, indent=2)
    return 0


def with_generation_defaults(params, defaults: dict, given: set[str]):
    """``params`` with the generation config's ``defaults`` for the fields the command line left out (``given``: the
    ones it set); ``max_tokens`` is capped by the config's, as the server caps it."""
    changes = {name: value for name, value in defaults.items() if name not in given and name != "max_tokens"}
    if "max_tokens" in defaults:
        changes["max_tokens"] = min(params.max_tokens, defaults["max_tokens"])
    return replace(params, **changes) if changes else params


def generate_to_terminal(
    config,
    prompts: list[str],
    params,
    chat: bool,
    out,
    err,
    given: set[str] | None = None,
    chat_template: str | None = None,
) -> tuple[list, dict]:
    """Run ``prompts``; stream one prompt's text to ``out`` as it is generated, or show a tqdm bar on
    ``err`` for several and print each result at the end. Returns the outputs and timing stats.

    ``given``: the sampling fields the command line set; the others take the generation config's values
    (``with_generation_defaults``); None: ``params`` as they are. ``chat_template``: the template's text for ``chat``
    (None: the tokenizer's)."""
    from attnserve.engine.llm_engine import LLMEngine
    from attnserve.entrypoints.chat_utils import ChatTemplateOptions, apply_chat_template

    t0 = time.perf_counter()
    engine = LLMEngine(config, warn_kv_cache_limit=False)
    load_s = time.perf_counter() - t0
    if given is not None:
        params = with_generation_defaults(params, engine.generation_defaults, given)
    engine.check_params(params)
    tok = engine.tokenizer
    if chat:
        options = ChatTemplateOptions(chat_template)
        prompts = [apply_chat_template(tok, [{"role": "user", "content": p}], options) for p in prompts]
    token_prompts = [
        engine.check_prompt(
            tok.encode(p, add_special_tokens=not chat), truncate_prompt_tokens=params.truncate_prompt_tokens
        )
        for p in prompts
    ]
    for ids in token_prompts:  # refused as LLM.generate and the server refuse it, not cut short at max_model_len
        engine.check_max_tokens(len(ids), params)
    engine.warn_kv_cache_limit()  # once every prompt fits: a prompt that does not is one error line, not both
    stream = len(prompts) == 1 and params.n == 1
    ids = [engine.add_request(p, params, final_only=not stream) for p in token_prompts]  # streamed: every step's
    bar = None
    if not stream:
        from tqdm import tqdm

        bar = tqdm(total=len(ids), desc="Processed prompts", unit="req", file=err)
    final, t1 = {}, time.perf_counter()
    while engine.has_unfinished_requests():
        for o in engine.step():
            if stream:
                out.write(o.outputs[0].text_delta)
                out.flush()
            if o.finished:
                final[o.request_id] = o
                if bar is not None:
                    bar.update(1)
    gen_s = time.perf_counter() - t1
    if bar is not None:
        bar.close()
    outputs = [final[i] for i in ids]
    for prompt, o in zip(prompts, outputs):
        o.prompt = prompt  # the text the model saw (chat template applied), for --output-json
    if stream:
        out.write("\n")
    else:
        for prompt, o in zip(prompts, outputs):
            for c in o.outputs:
                out.write(f"--- prompt: {prompt!r}" + (f" [{c.index}]" if params.n > 1 else "") + f"\n{c.text}\n")
    new_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    ttfts = [o.metrics.ttft for o in outputs if o.metrics.ttft is not None]
    stats = {
        "model_load_s": load_s,
        "generate_s": gen_s,
        "prompt_tokens": sum(len(p) for p in token_prompts),
        "generated_tokens": new_tokens,
        "output_tokens_per_s": new_tokens / gen_s if gen_s > 0 else None,
        "mean_ttft_s": sum(ttfts) / len(ttfts) if ttfts else None,
        "attention_backend": engine.info.backend_name,
        "device": str(engine.info.device),
        "dtype": str(engine.info.dtype).removeprefix("torch."),
        "kv_cache_dtype": str(engine.info.kv_dtype).removeprefix("torch."),
    }
    # the cache's type where it is not the model's (fp8): the start-up log line may not be shown
    kv = f", KV cache {stats['kv_cache_dtype']}" if stats["kv_cache_dtype"] != stats["dtype"] else ""
    err.write(
        f"[attnserve] {new_tokens} tokens in {gen_s:.2f} s ({stats['output_tokens_per_s']:.1f} tok/s), "
        f"backend {stats['attention_backend']}, {stats['device']}, {stats['dtype']}{kv}; model loaded in {load_s:.1f} s\n"
    )
    return outputs, stats
