"""Test helpers: tiny random models from transformers configs, and transformers' greedy reference."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def save_tiny_model(config, path, seed: int = 0, norm_std: float | None = None) -> None:
    """Build a random-weight transformers model from ``config`` and save it (safetensors) to ``path``;
    ``norm_std``: also draw the 1-D weights (norms) from N(0, norm_std) instead of keeping their init."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger than init std so that random models have peaked, unambiguous argmaxes
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
            elif norm_std is not None:
                p.normal_(0.0, norm_std)
    # without transformers' progress bar on stderr: a test that checks stderr may be the first to build the model
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path, safe_serialization=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()


def hf_reference(path, dtype: torch.dtype = torch.float32):
    """transformers' model of the folder ``path`` (eager attention, eval mode): the reference the tiny-model tests
    compare with. gpt-oss's experts get the config's ``swiglu_alpha`` and ``swiglu_limit``: transformers up to at least
    5.17 hard-codes 1.702 and 7.0 in ``GptOssExperts`` and ignores the config, which the tiny models set to a limit of
    0.5; attnserve and later transformers (5.24) read the config."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    pin_swiglu_to_config(model)
    return model


def pin_swiglu_to_config(model) -> int:
    """Set every gpt-oss expert block's ``alpha``/``limit`` of transformers' ``model`` to its config's
    ``swiglu_alpha``/``swiglu_limit`` (defaults 1.702, 7.0); returns how many blocks changed (0 where transformers
    already reads the config, or for another architecture)."""
    config = model.config
    alpha, limit = getattr(config, "swiglu_alpha", 1.702), getattr(config, "swiglu_limit", 7.0)
    changed = 0
    for module in model.modules():
        if type(module).__name__ == "GptOssExperts" and (module.alpha, module.limit) != (alpha, limit):
            module.alpha, module.limit = alpha, limit
            changed += 1
    return changed


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens (EOS ignored) and the last-position logits of the prompt, float32."""
    ids = torch.tensor([prompt_ids])
    out = model(ids, use_cache=True)
    first_logits = out.logits[0, -1].float()
    past, tokens = out.past_key_values, []
    next_id = int(first_logits.argmax())
    for _ in range(max_new_tokens):
        tokens.append(next_id)
        out = model(torch.tensor([[next_id]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        next_id = int(out.logits[0, -1].argmax())
    return tokens, first_logits


def abort_second_while_in_flight(engine, keep_prompt: list[int], drop_prompt: list[int], params) -> dict:
    """Queue two requests, step twice (async scheduling: a step is then in flight), abort the second, run
    to the end; returns the finished outputs by request id (only the first's when the abort worked)."""
    keep = engine.add_request(keep_prompt, params)
    drop = engine.add_request(drop_prompt, params)
    engine.step()
    engine.step()
    assert engine._in_flight is not None
    engine.abort_request(drop)
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert list(final) == [keep]
    return final


def seeded_randn(seed: int, device: str = "cpu"):
    """``randn(*shape, dt, scale=1.0)``: standard-normal draws times ``scale`` in dtype ``dt`` on ``device``, from one
    CPU generator seeded with ``seed`` (the same cases on every machine and device, in call order)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, dt, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

    return randn


def run_cases_in_subprocess(module: str, cases, folder: Path, interpret: bool, timeout: float = 600):
    """``python -m module in.pt out.pt`` in a process of its own, with ``TRITON_INTERPRET=1`` or without it (the
    interpreter mode is fixed when Triton's kernels are decorated); the cases go in and their results come back
    through ``folder``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    torch.save(cases, folder / "in.pt")
    proc = subprocess.run(
        [sys.executable, "-m", module, str(folder / "in.pt"), str(folder / "out.pt")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(folder / "out.pt")


def run_cases_in_triton_interpreter(module: str, cases: dict, folder: Path) -> dict:
    """:func:`run_cases_in_subprocess` under ``TRITON_INTERPRET=1``."""
    return run_cases_in_subprocess(module, cases, folder, interpret=True)


@dataclass(frozen=True)
class Refuses:
    """What a command-line refusal says, as data: the place its line names after ``PROG: error: `` (``argument
    --port``, a config file) and the fields of the record the line is made from (unset: not checked)."""

    where: str
    value: object = None
    allowed: str | None = None
    path: tuple | None = None
    key: str | None = None
    reason: str | None = None
    advice: str | None = None


def assert_cli_refusal(err: str, prog: str, want: Refuses | str, worded: list) -> None:
    """``err`` (stderr) is one line ``PROG: error: WHERE...`` made from the last record worded (the ``worded``
    fixture's list), its statement in the line, its fields ``want``'s. A ``str`` ``want`` is a line worded without a
    record (argparse's own, or no record yet): the whole line, PROG included."""
    from attnserve.refusals import statement

    if isinstance(want, str):
        assert err.strip() == want, err
        return
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: {want.where}"), err
    assert worded, err
    r = worded[-1]
    fields = {k: v for k, v in dataclasses.asdict(want).items() if k != "where" and v is not None}
    got = {k: getattr(r, k) for k in fields}
    nan = lambda v: isinstance(v, float) and math.isnan(v)  # noqa: E731
    assert got == fields or all(nan(got[k]) and nan(v) or got[k] == v for k, v in fields.items()), (r, err)
    assert statement(dataclasses.replace(r, advice="", suggestion=None)) in err, (r, err)
