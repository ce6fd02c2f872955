"""gpt-oss on the GPU, bisected layer by layer against transformers: where do attnserve's tiny gpt-oss models
(``tests/models/tiny.py``, hidden 256 as the GPU tests build them) first differ from the reference?

``python -m benchmarks.gpu.gpt_oss_bisect [--archs gpt_oss gpt_oss_sw] [--variants ...] [--json OUT]`` on a GPU
(about a minute on an H200; ``--variants cpu`` alone runs without one).

One prefill of a 30-token prompt (past the window of 8) through attnserve's model runner, with forward hooks on
every decoder layer, its attention and its MoE block, against the same hooks on transformers' float32 eager model
on the CPU. Two references: ``native`` (transformers as installed: up to 5.17 its ``GptOssExperts`` clamp at
7.0 whatever ``swiglu_limit`` says) and ``pinned`` (the experts given the config's ``swiglu_alpha`` and
``swiglu_limit``, 0.5 in the tiny models; ``tests.helpers.hf_reference``, what the tests compare with).

attnserve's variants (``--variants``; default ``triton torch_moe torch_ops flex_torch cpu`` in float32 and
``triton`` in bfloat16, ``--bf16-variants``), each a fresh engine with ``enforce_eager``:

- ``triton``: TRITON_ATTN (its sinks), the Triton RoPE + KV write, norms and fused MoE: what the GPU tests run;
- ``torch_moe``: the same with the fused MoE's PyTorch definition (``kernels.moe.fused_experts_reference``);
- ``torch_ops``: the same with the PyTorch RMSNorm / RoPE / KV write (``kernels.fused_ops`` without Triton);
- ``no_pdl``: ``triton`` with ``enable_pdl=False``;
- ``flex``: FLEX_ATTENTION (sinks from flex_attention's log-sum-exp) instead of the Triton attention kernel;
- ``flex_torch``: FLEX_ATTENTION, the PyTorch ops and MoE: the GPU path closest to the CPU's;
- ``cpu``: CPU_ATTN on the CPU (float32 only): the path ``tests/models/test_tiny_models.py`` checks.

Output: a ``header`` JSON line per model (versions, the config's and the native reference's ``swiglu_limit``),
then per variant and dtype one line per layer: ``attn``, ``mlp``, ``hidden`` (the residual stream after the layer)
as max |ours - ref| / max |ref| against ``pinned``, and ``hidden_native`` against ``native``; then a ``logits``
line (the prompt's last-position logits, the same error, both references) with ``tokens_equal``: the 8 greedy
tokens from ``LLM.generate`` (the greedy head on the GPU) equal ``pinned``'s. float32 rows should be ~1e-5 against
``pinned``; a first layer far off names the part (attention or MoE) that differs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile

import torch

PROMPT = list(range(100, 130))  # 30 tokens: past the tiny models' window of 8
NEW_TOKENS = 8
GPU_VARIANTS = ["triton", "torch_moe", "torch_ops", "no_pdl", "flex", "flex_torch"]
VARIANTS = [*GPU_VARIANTS, "cpu"]
DEFAULT_VARIANTS = ["triton", "torch_moe", "torch_ops", "flex_torch", "cpu"]  # flex_attention compiles: kept few


def _first(out):
    return out[0] if isinstance(out, tuple) else out


class Capture:
    """Forward hooks on each decoder layer, its ``self_attn`` and ``mlp``: the outputs as (T, H) float64 CPU tensors.
    ``stream(out)`` turns a layer's output into the residual stream after it."""

    def __init__(self, layers, stream) -> None:
        self.out: dict[tuple[str, int], torch.Tensor] = {}
        self.handles = []
        for i, layer in enumerate(layers):
            for part, module, read in (
                ("hidden", layer, stream),
                ("attn", layer.self_attn, _first),
                ("mlp", layer.mlp, _first),
            ):
                self.handles.append(module.register_forward_hook(self._hook(part, i, read)))

    def _hook(self, part: str, i: int, read):
        def hook(module, args, out):
            if (part, i) not in self.out:  # the first call only (the prompt's prefill)
                t = read(out).detach()
                self.out[part, i] = t.reshape(-1, t.shape[-1]).double().cpu()

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref| over the prompt's rows (``ours`` may carry padding rows after them)."""
    ours = ours[: ref.shape[0]]
    return (ours - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)


def reference(path: str, pinned: bool) -> dict:
    """transformers' layer outputs, last-position logits and greedy tokens on PROMPT (float32, CPU, eager)."""
    from transformers import AutoModelForCausalLM

    from tests.helpers import hf_greedy, pin_swiglu_to_config

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    limit = next(m.limit for m in hf.modules() if type(m).__name__ == "GptOssExperts")
    if pinned:
        pin_swiglu_to_config(hf)
    cap = Capture(hf.model.layers, _first)
    with torch.no_grad():
        hf(torch.tensor([PROMPT]))
    cap.remove()
    tokens, logits = hf_greedy(hf, PROMPT, NEW_TOKENS)
    return dict(out=cap.out, logits=logits.double(), tokens=tokens, limit=limit, layers=len(hf.model.layers))


@contextlib.contextmanager
def paths(variant: str):
    """The PyTorch definitions in place of the Triton MoE and/or fused ops, for the variants that ask."""
    from attnserve.kernels import fused_ops, moe

    saved = moe._triton_moe, fused_ops._triton_ops
    if variant in ("torch_moe", "flex_torch"):
        moe._triton_moe = lambda: None
    if variant in ("torch_ops", "flex_torch"):
        fused_ops._triton_ops = lambda: None
    try:
        yield
    finally:
        moe._triton_moe, fused_ops._triton_ops = saved


def run_ours(path: str, dtype: str, variant: str) -> dict:
    """attnserve's layer outputs and last-position logits on PROMPT (a runner call), then its greedy tokens."""
    from attnserve import LLM, SamplingParams
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    engine = dict(dtype=dtype, block_size=16, max_model_len=256, kv_cache_memory=64 << 20, enforce_eager=True)
    if variant == "cpu":
        engine.update(device="cpu", attention_backend="CPU_ATTN")
    else:
        engine["attention_backend"] = "FLEX_ATTENTION" if variant.startswith("flex") else "TRITON_ATTN"
        if variant == "no_pdl":
            engine["enable_pdl"] = False
    with paths(variant):
        llm = LLM(path, **engine)
        model = llm.engine.runner.model
        cap = Capture(model.layers, lambda out: out[0].double() + out[1].double())
        blocks = list(range(-(-len(PROMPT) // 16)))
        reqs = [ScheduledRequest("bisect", PROMPT, 0, blocks, SamplingParams(max_tokens=1), True)]
        with torch.no_grad():
            logits = llm.engine.runner.compute_logits(SchedulerOutput(requests=reqs))[0].double().cpu()
        cap.remove()
        llm.reset_prefix_cache()
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        tokens = llm.generate([PROMPT], params)[0].outputs[0].token_ids
        llm.engine.shutdown()
    return dict(out=cap.out, logits=logits, tokens=list(tokens))


def tokenizer():
    """The tests' tokenizer: ``$ATTNSERVE_TEST_TOKENIZER``'s folder, else the default model's."""
    folder = os.environ.get("ATTNSERVE_TEST_TOKENIZER")
    if folder:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    from attnserve.model_executor.loader import load_tokenizer, resolve_model_source

    return load_tokenizer(resolve_model_source(None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", nargs="+", default=["gpt_oss", "gpt_oss_sw"], help="tests/models/tiny.py names")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=DEFAULT_VARIANTS)
    ap.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    ap.add_argument("--bf16-variants", nargs="+", choices=VARIANTS, default=["triton"])
    ap.add_argument("--hidden", type=int, default=256, help="the GPU tests' GPU_HIDDEN")
    ap.add_argument("--json", help="also write the lines here")
    args = ap.parse_args()
    import transformers

    from tests.models.tiny import make_tiny_model

    if not torch.cuda.is_available():
        args.variants = [v for v in args.variants if v == "cpu"]
    tok = tokenizer()
    lines: list[dict] = []

    def emit(row: dict) -> None:
        lines.append(row)
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs:
            path = make_tiny_model(arch, os.path.join(tmp, arch), tok, args.hidden)
            refs = {"native": reference(path, False), "pinned": reference(path, True)}
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(path)
            emit(
                dict(
                    kind="header",
                    arch=arch,
                    transformers=transformers.__version__,
                    torch=torch.__version__,
                    config_swiglu_limit=getattr(config, "swiglu_limit", None),
                    native_reference_limit=refs["native"]["limit"],
                    native_tokens_equal_pinned=refs["native"]["tokens"] == refs["pinned"]["tokens"],
                )
            )
            pinned, native = refs["pinned"], refs["native"]
            for dtype in args.dtypes:
                variants = (
                    args.variants if dtype == "float32" else [v for v in args.variants if v in args.bf16_variants]
                )
                for variant in variants:
                    if variant == "cpu" and dtype != "float32":
                        continue
                    where = dict(arch=arch, dtype=dtype, variant=variant)
                    try:
                        ours = run_ours(path, dtype, variant)
                    except Exception as e:  # one variant failing must not hide the others
                        emit(dict(kind="error", **where, error=f"{type(e).__name__}: {e}"[:300]))
                        continue
                    for i in range(pinned["layers"]):
                        row = dict(kind="layer", **where, layer=i)
                        for part in ("attn", "mlp", "hidden"):
                            row[part] = rel(ours["out"][part, i], pinned["out"][part, i])
                        row["hidden_native"] = rel(ours["out"]["hidden", i], native["out"]["hidden", i])
                        emit(row)
                    emit(
                        dict(
                            kind="logits",
                            **where,
                            logits=rel(ours["logits"][None], pinned["logits"][None]),
                            logits_native=rel(ours["logits"][None], native["logits"][None]),
                            tokens_equal=ours["tokens"] == pinned["tokens"],
                            tokens_equal_native=ours["tokens"] == native["tokens"],
                        )
                    )
    if args.json:
        with open(args.json, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in lines))


if __name__ == "__main__":
    main()
