"""A request's sampling fields -> ``SamplingParams``: the checks of fields that are refused or only allowed
together, the defaults of fields left unset (the request's, else the generation config's, else OpenAI's),
``logit_bias``'s token ids, prompt truncation (``truncate_prompt_tokens``), and a SamplingParams refusal
written as the server's 400."""

from __future__ import annotations

import dataclasses

from attnserve.core.sampling_params import SamplingParams, SamplingParamsError
from attnserve.core.structured_outputs import StructuredOutputsParams
from attnserve.entrypoints.openai.errors import OpenAIError
from attnserve.entrypoints.openai.protocol import SamplingFields
from attnserve.entrypoints.openai.serving import ServingContext, refusal_error
from attnserve.entrypoints.openai.vllm_fields import check_extra_fields
from attnserve.refusals import Refused
from attnserve.refusals import serving as words

# temperatures below this are greedy (vLLM's _SAMPLING_EPS): logits / 1e-300 overflow to inf
_GREEDY_EPS = 1e-5


def check_stream_options(req: SamplingFields) -> None:
    """400 for stream_options on a request that does not stream (OpenAI and vLLM refuse it too), and for vLLM's
    ``continuous_usage_stats: true`` (usage in every chunk), which attnserve does not implement."""
    if req.stream_options is not None and not req.stream:
        raise OpenAIError(words.STREAM_OPTIONS, 400, param="stream_options")
    if req.stream_options is not None and req.stream_options.continuous_usage_stats:
        raise refusal_error(words.CONTINUOUS_USAGE_STATS)


def check_fields(req, known) -> None:
    """The 400 for a vLLM field ``req``'s model does not declare, set to a value that would change what runs;
    a warning in the log for other undeclared fields (``vllm_fields.check_extra_fields``)."""
    try:
        check_extra_fields(req, known)
    except Refused as e:
        raise refusal_error(e.refusal) from None


def check_unsupported(req: SamplingFields) -> None:
    """400 for OpenAI parameters this engine does not implement (rather than silently ignoring them).

    Raises OpenAIError (400) naming the parameter: prompt_logprobs with stream (vLLM refuses it)."""
    if req.prompt_logprobs is not None and req.stream:
        raise OpenAIError(words.PROMPT_LOGPROBS_STREAM, 400, param="prompt_logprobs")


# OpenAI's defaults of the fields a request may leave unset (null), after the generation config's (vLLM's
# _DEFAULT_SAMPLING_PARAMS)
_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def defaulted(req: SamplingFields, defaults: dict) -> dict:
    """The values of the fields of ``_DEFAULTS`` that ``req`` declares (and SamplingParams has): the request's,
    else the generation config's (``defaults``), else OpenAI's; vLLM's order."""
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    return {
        name: value if (value := getattr(req, name)) is not None else defaults.get(name, fallback)
        for name, fallback in _DEFAULTS.items()
        if name in type(req).model_fields and name in known
    }


def sampling_params(
    ctx: ServingContext,
    req: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    logprobs_param: str = "logprobs",
    constraint: tuple[str, StructuredOutputsParams] | None = None,
) -> SamplingParams:
    """SamplingParams from a request's fields, a field left unset taking the generation config's default, and
    ``max_tokens`` capped by that config's, as vLLM does; checked against the model and engine too
    (``LLMEngine.check_params``: a stop token id outside the vocabulary, more logprobs than --max-logprobs, the
    output constraint compiles); 400 naming the bad value (``logprobs_param``: the request's name for
    ``logprobs``, chat's ``top_logprobs``). ``constraint``: (the field that asked, the constraint),
    :func:`structured_outputs`' or tool calling's."""
    values = defaulted(req, ctx.generation_defaults)
    if values["temperature"] < _GREEDY_EPS:
        values["temperature"] = 0.0
    cap = ctx.generation_defaults.get("max_tokens")
    try:
        params = SamplingParams(
            n=req.n,
            **values,
            seed=req.seed,
            max_tokens=max_tokens if cap is None else min(max_tokens, cap),
            stop=[] if req.stop is None else req.stop,
            stop_token_ids=req.stop_token_ids or [],
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            logit_bias=logit_bias(req.logit_bias),
            min_tokens=req.min_tokens,
            bad_words=req.bad_words,
            allowed_token_ids=req.allowed_token_ids,
            prompt_logprobs=req.prompt_logprobs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            truncate_prompt_tokens=req.truncate_prompt_tokens,
            structured_outputs=None if constraint is None else constraint[1],
        )
        ctx.engine.engine.check_params(params)
        return params
    except SamplingParamsError as e:
        if e.path == ("logprobs",):
            e = SamplingParamsError(logprobs_param, e.value, e.allowed, e.index)
        raise sampling_error(e) from None
    except Refused as e:  # the constraint did not compile (or xgrammar is missing): named by the request's field
        refusal = e.refusal
        if (
            constraint is not None
            and constraint[0] != "structured_outputs"
            and refusal.path[:1] == ("structured_outputs",)
        ):
            refusal = dataclasses.replace(refusal, path=(constraint[0], *refusal.path[2:]))
        raise refusal_error(refusal) from None


def truncate_prompt(ctx: ServingContext, token_ids: list[int], req: SamplingFields) -> list[int]:
    """The prompt's last ``truncate_prompt_tokens`` tokens (-1: max_model_len), before the length checks (vLLM)."""
    t = req.truncate_prompt_tokens
    return token_ids if t is None or t == 0 else ctx.engine.engine.truncate(token_ids, t)


def logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """The request's logit_bias with integer token ids, each bias clamped to [-100, 100] (OpenAI's range, as vLLM
    clamps it); 400 naming a key that is not a token id."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise refusal_error(words.logit_bias_key(key)) from None
        out[token] = min(100.0, max(-100.0, value))
    return out


def sampling_error(e: SamplingParamsError) -> OpenAIError:
    """The 400 for a SamplingParams refusal in the server's words: the field's path (``stop_token_ids.1``), the
    value as JSON, what is allowed."""
    return refusal_error(e.refusal)
