"""Named inputs for the Triton GEMV, and a runner for it under the Triton interpreter.

``python -m tests.kernels.gemv_cases IN OUT`` (with ``TRITON_INTERPRET=1`` set before Triton is imported)
loads the cases saved at IN, runs each through ``attnserve.kernels.triton_gemv.gemv`` on CPU tensors and
saves the results at OUT (plus the split-K counters after all cases: they must be back to zero). A SwiGLU
case (``act="silu_mul"``: x is a gate/up output (M, 2K)) gives the pair (fused GEMV, the same config's plain
GEMV of the ``silu_and_mul`` kernel's output); a gate/up case (``out_act="silu_mul"``: the weight is
``[gate; up]`` (2N, K)) gives the triple (fused GEMV, the same config's plain GEMV (M, 2N), the ``silu_and_mul``
kernel of that plain output).
"""

from __future__ import annotations

import sys

import torch

from tests.helpers import seeded_randn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# (name, config fields or None for the default chooser): FMA and tensor-core paths, one K step or several,
# one split or several (a split count that does not divide the K steps evenly included), N tiles that
# overhang N
CONFIGS = {
    "default": None,
    "fma-n16-k32": dict(block_n=16, block_k=32),
    "fma-n8-k64-split3": dict(block_n=8, block_k=64, split_k=3),
    "fma-n32-k16-split4": dict(block_n=32, block_k=16, split_k=4),
    "dot-n16-k32": dict(block_n=16, block_k=32, dot=True),
    "dot-n32-k16-split4": dict(block_n=32, block_k=16, split_k=4, dot=True),
    # gemv.tiles.whole_k_config's kind: one K step of 256 (masked where K < 256), no split, no loop
    "fma-n2-k256-whole": dict(block_n=2, block_k=256, num_stages=1),
}

# (M, N, K): N and K that are not multiples of any block, M = 1 and M = 3 (padded rows), M = 8
SHAPES = [(1, 37, 100), (3, 50, 130), (1, 64, 256), (8, 33, 192), (2, 16, 48)]


def make_cases(device: str = "cpu", dtypes=tuple(DTYPES)) -> dict[str, dict]:
    randn = seeded_randn(0, device)

    cases: dict[str, dict] = {}
    for dname in dtypes:
        dt = DTYPES[dname]
        for m, n, k in SHAPES:
            for cname, cfg in CONFIGS.items():
                if dname == "fp16" and cname not in ("default", "dot-n32-k16-split4"):
                    continue  # fp16 shares every code path with bf16: two configs are enough
                for bias in (False, True):
                    cases[f"{m}x{n}x{k}-{cname}-{'bias' if bias else 'nobias'}-{dname}"] = dict(
                        x=randn(m, k, dt=dt),
                        weight=randn(n, k, dt=dt),
                        bias=randn(n, dt=dt) if bias else None,
                        config=cfg,
                    )
        # x rows with a stride (a slice of a wider activation), split K
        wide = randn(3, 160, dt=dt)
        cases[f"strided_x-{dname}"] = dict(
            x=wide[:, :128], weight=randn(40, 128, dt=dt), bias=None, config=dict(block_n=16, block_k=32, split_k=2)
        )
        for m, n, k in MANY_ROWS_SHAPES:
            for cname, cfg in MANY_ROWS_CONFIGS.items():
                if (cname == "fma-n8-k32" and m > 16) or (dname == "fp16" and cname != "dot-n32-k16-split4"):
                    continue  # FMA takes <= 16 rows; fp16 shares every code path with bf16
                for bias in (False, True):
                    cases[f"{m}x{n}x{k}-{cname}-{'bias' if bias else 'nobias'}-{dname}"] = dict(
                        x=randn(m, k, dt=dt),
                        weight=randn(n, k, dt=dt),
                        bias=randn(n, dt=dt) if bias else None,
                        config=cfg,
                    )
    return cases


# 16..64 rows (the tensor-core path's x tile of 16, 32 or 64 rows; the padded rows 24 -> 32, 40 and 48 -> 64
# computed on clamped copies and never stored), N and K not multiples of the blocks (but 32 x 64 x 128);
# the default (dot past 16 rows in every dtype, float32 too), tensor-core tiles with and without split-K
# (a split count not dividing the K steps), and the FMA path at its 16-row limit
MANY_ROWS_SHAPES = [(16, 40, 96), (24, 33, 100), (32, 64, 128), (40, 20, 70), (48, 50, 130), (64, 37, 72)]
MANY_ROWS_CONFIGS = {
    "default": None,
    "fma-n8-k32": dict(block_n=8, block_k=32),
    "dot-n16-k32": dict(block_n=16, block_k=32, dot=True),
    "dot-n32-k16-split4": dict(block_n=32, block_k=16, split_k=4, dot=True),
    "dot-n64-k32-split3": dict(block_n=64, block_k=32, split_k=3, dot=True),
}


# SwiGLU prologue: (M, N, I) with I (the down projection's K) odd or not a multiple of the block, M = 1, 2,
# 3 (padded rows), 8; configs without and with split-K (one not dividing the K steps), FMA and tensor cores
SILU_MUL_SHAPES = [(1, 37, 100), (2, 24, 77), (3, 50, 130), (8, 33, 61)]
SILU_MUL_CONFIGS = {
    "default": None,
    "fma-n16-k32": dict(block_n=16, block_k=32),
    "fma-n8-k16-split3": dict(block_n=8, block_k=16, split_k=3),
    "dot-n16-k32": dict(block_n=16, block_k=32, dot=True),
    "dot-n32-k16-split4": dict(block_n=32, block_k=16, split_k=4, dot=True),
}


# the SwiGLU prologue on 16..64 rows (x tiles of 16, 32 and 64 rows), tensor cores (the default past 16 rows)
SILU_MUL_MANY_ROWS_SHAPES = [(16, 24, 40), (24, 33, 61), (32, 20, 48), (48, 37, 100), (64, 16, 45)]
SILU_MUL_MANY_ROWS_CONFIGS = {
    "default": None,
    "dot-n16-k32": dict(block_n=16, block_k=32, dot=True),
    "dot-n32-k16-split4": dict(block_n=32, block_k=16, split_k=4, dot=True),
}


def make_silu_mul_cases(device: str = "cpu", dtypes=tuple(DTYPES)) -> dict[str, dict]:
    """``silu_mul-...`` cases: x (M, 2I) = [gate | up] (scaled by 3: the silu's curved part and its tails),
    the down weight (N, I) scaled by I^-1/2, a bias in half of them."""
    randn = seeded_randn(1, device)

    cases: dict[str, dict] = {}
    for dname in dtypes:
        dt = DTYPES[dname]
        for i, (m, n, inter) in enumerate(SILU_MUL_SHAPES):
            for cname, cfg in SILU_MUL_CONFIGS.items():
                bias = (i + len(cname)) % 2 == 0
                cases[f"silu_mul-{m}x{n}x{inter}-{cname}-{'bias' if bias else 'nobias'}-{dname}"] = dict(
                    x=randn(m, 2 * inter, dt=dt, scale=3.0),
                    weight=randn(n, inter, dt=dt, scale=inter**-0.5),
                    bias=randn(n, dt=dt) if bias else None,
                    config=cfg,
                    act="silu_mul",
                )
        for i, (m, n, inter) in enumerate(SILU_MUL_MANY_ROWS_SHAPES):
            for cname, cfg in SILU_MUL_MANY_ROWS_CONFIGS.items():
                bias = (i + len(cname)) % 2 == 0
                cases[f"silu_mul-{m}x{n}x{inter}-{cname}-{'bias' if bias else 'nobias'}-{dname}"] = dict(
                    x=randn(m, 2 * inter, dt=dt, scale=3.0),
                    weight=randn(n, inter, dt=dt, scale=inter**-0.5),
                    bias=randn(n, dt=dt) if bias else None,
                    config=cfg,
                    act="silu_mul",
                )
        # the gate/up rows as a slice of a wider buffer (a row stride past 2I)
        wide = randn(3, 2 * 45 + 6, dt=dt, scale=3.0)
        cases[f"silu_mul-strided_x-{dname}"] = dict(
            x=wide[:, :90],
            weight=randn(20, 45, dt=dt, scale=45**-0.5),
            bias=None,
            config=dict(block_n=16, block_k=16, split_k=2),
            act="silu_mul",
        )
    return cases


# SwiGLU epilogue (the gate/up projection): (M, N, K) with the weight [gate; up] (2N, K) and y (M, N); N = 30
# (not a multiple of a tile's 2..16 output columns but for the 2-row tile's 1) and N = 3 (less than one
# tile's columns); K not a multiple of block_k (a masked step) or a multiple; M = 1, 3 (padded rows) and 17
# (past the FMA path: tensor cores only, x tiles of 32 rows)
SWIGLU_SHAPES = [(1, 30, 100), (1, 3, 64), (3, 30, 130), (3, 3, 48), (17, 30, 70), (17, 3, 96)]
# FMA and tensor-core tiles, split-K 1 and 2; the default is resolved for the (2N, K) weight
SWIGLU_CONFIGS = {
    "default": None,
    "fma-n2-k32": dict(block_n=2, block_k=32),
    "fma-n8-k32-split2": dict(block_n=8, block_k=32, split_k=2),
    "dot-n16-k32": dict(block_n=16, block_k=32, dot=True),
    "dot-n32-k16-split2": dict(block_n=32, block_k=16, split_k=2, dot=True),
}


def make_swiglu_cases(device: str = "cpu", dtypes=("bf16", "fp32")) -> dict[str, dict]:
    """``swiglu-...`` cases: x (M, K) scaled by 3 and the gate/up weight (2N, K) scaled by K^-1/2 (gate and
    up of a few units: the silu's curved part and its tails), without and with a bias (2N,)."""
    randn = seeded_randn(2, device)

    cases: dict[str, dict] = {}
    for dname in dtypes:
        dt = DTYPES[dname]
        for m, n, k in SWIGLU_SHAPES:
            for cname, cfg in SWIGLU_CONFIGS.items():
                if m > 16 and cname.startswith("fma"):
                    continue  # the FMA path takes <= 16 rows
                for bias in (False, True):
                    cases[f"swiglu-{m}x{n}x{k}-{cname}-{'bias' if bias else 'nobias'}-{dname}"] = dict(
                        x=randn(m, k, dt=dt, scale=3.0),
                        weight=randn(2 * n, k, dt=dt, scale=k**-0.5),
                        bias=randn(2 * n, dt=dt) if bias else None,
                        config=cfg,
                        out_act="silu_mul",
                    )
        for bias in (False, True):  # K = 0: no launch, the SwiGLU of the bias (of zeros without one)
            cases[f"swiglu-2x3x0-fma-n2-k16-{'bias' if bias else 'nobias'}-{dname}"] = dict(
                x=randn(2, 0, dt=dt),
                weight=randn(6, 0, dt=dt),
                bias=randn(6, dt=dt, scale=3.0) if bias else None,
                config=dict(block_n=2, block_k=16),
                out_act="silu_mul",
            )
    return cases


def run(case: dict, gemv) -> torch.Tensor:
    from attnserve.kernels.triton_gemv import GemvConfig

    cfg = case["config"]
    return gemv(
        case["x"],
        case["weight"],
        case["bias"],
        None if cfg is None else GemvConfig(**cfg),
        act=case.get("act", "none"),
        out_act=case.get("out_act", "none"),
    )


def run_silu_mul_pair(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(the fused GEMV, the plain GEMV of the same config on the ``silu_and_mul`` kernel's output). A case
    without a config takes the fused GEMV's default (``default_config(..., act="silu_mul")``) for both: past
    16 rows it has a shorter K step than the plain default, so another summation order."""
    import dataclasses

    from attnserve.kernels import triton_gemv
    from attnserve.kernels import triton_fused_ops

    if case["config"] is None:
        (m, _), (n, k) = case["x"].shape, case["weight"].shape
        cfg = triton_gemv.default_config(n, k, m, case["x"].element_size(), act="silu_mul")
        case = dict(case, config=dataclasses.asdict(cfg))
    plain = dict(case, x=triton_fused_ops.silu_and_mul(case["x"]), act="none")
    return run(case, triton_gemv.gemv), run(plain, triton_gemv.gemv)


def run_swiglu_triple(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the GEMV with the SwiGLU epilogue, the plain GEMV of the same config (M, 2N), the ``silu_and_mul``
    kernel of that plain output). A case without a config takes ``default_config`` of the (2N, K) weight for
    both (what ``gemv`` picks)."""
    import dataclasses

    from attnserve.kernels import triton_gemv
    from attnserve.kernels import triton_fused_ops

    if case["config"] is None:
        (m, k), n2 = case["x"].shape, case["weight"].shape[0]
        case = dict(case, config=dataclasses.asdict(triton_gemv.default_config(n2, k, m, case["x"].element_size())))
    plain = run(dict(case, out_act="none"), triton_gemv.gemv)
    return run(case, triton_gemv.gemv), plain, triton_fused_ops.silu_and_mul(plain)


# row counts sent through the layers of a plan that picks Triton at every bucket: two small buckets (3: the
# 4-row bucket's), 40 (the 48-row bucket's) and 65, past the largest bucket (cuBLAS)
ROUTED_ROWS = (1, 3, 40, 65)


def bucket(rows: int) -> int:
    """The smallest ``DECODE_MS`` bucket holding ``rows`` rows."""
    from attnserve.gemv.choices import DECODE_MS

    return next(m for m in DECODE_MS if m >= rows)


def bucket_config(block_n: int):
    """``m -> GemvConfig``: split-K FMA tiles of ``block_n`` weight rows up to 16 rows, tensor cores past
    16 (the FMA path's limit)."""
    from attnserve.kernels.triton_gemv import MAX_FMA_M, GemvConfig

    return lambda m: GemvConfig(block_n=block_n, block_k=32, split_k=2, dot=m > MAX_FMA_M)


def layer_outputs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``name -> (layer output, F.linear reference)`` for every linear layer and the LM head of a tiny
    Qwen2 (qkv bias, untied head) and a tiny Llama 3 (tied head), float32, after a GemvPlan that picks the
    Triton GEMV for every shape and bucket (FMA up to 16 rows, tensor cores past that); 1, 3 and 40 rows
    take it (40: the 48-row bucket's), 65 rows is past the tables (cuBLAS path)."""
    import torch.nn.functional as F

    from attnserve.layers.embedding import VocabParallelEmbedding
    from attnserve.gemv.choices import DECODE_MS, GemvChoice
    from attnserve.gemv.methods import GemvLinearMethod
    from attnserve.gemv.plan import GemvPlan, gemv_layers
    from attnserve.models.llama import LlamaForCausalLM
    from tests.models.tiny import tiny_config

    out = {}
    for arch in ("qwen2", "llama3"):
        config = tiny_config(arch)
        config.vocab_size = 300
        torch.manual_seed(0)
        model = LlamaForCausalLM(config, lambda spec, i: torch.nn.Identity())
        for p in model.parameters():
            p.data.normal_(0.0, 0.1)
        shapes = {tuple(w.shape) for _, w in gemv_layers(model)}
        cfg = bucket_config(64)  # big tiles: few interpreted programs
        plan = GemvPlan({(n, k, m): GemvChoice(n, k, m, 2.0, 1.0, cfg(m), True) for n, k in shapes for m in DECODE_MS})
        plan.install(model)
        for name, module in model.named_modules():
            if not isinstance(getattr(module, "quant_method", None), GemvLinearMethod):
                continue
            for rows in ROUTED_ROWS:
                x = torch.randn(rows, module.weight.shape[1])
                if isinstance(module, VocabParallelEmbedding):
                    got, want = module.logits(x), F.linear(x, module.weight).float()
                else:
                    got, want = module(x), F.linear(x, module.weight, module.bias)
                out[f"{arch}.{name}.rows{rows}"] = (got, want)
    return out


def _tiny_mlp_models(cfg, epilogue: bool):
    """(arch, model, dtype) of a tiny Llama (float32, MLP bias) and Qwen3 (bfloat16) after a plan that picks the plain
    Triton GEMV with ``cfg(bucket)`` everywhere and the down projection's SwiGLU prologue GEMV at every bucket;
    with ``epilogue`` the gate/up GEMV with the SwiGLU epilogue too (set by hand: a measured plan keeps one)."""
    from attnserve.gemv.choices import DECODE_MS, GemvChoice, SiluMulChoice
    from attnserve.gemv.plan import GemvPlan, gemv_layers
    from attnserve.models.llama import LlamaForCausalLM
    from attnserve.models.qwen import Qwen3ForCausalLM
    from tests.models.tiny import tiny_config

    for arch, cls, dtype in (("llama", LlamaForCausalLM, torch.float32), ("qwen3", Qwen3ForCausalLM, torch.bfloat16)):
        config = tiny_config(arch)
        config.vocab_size = 300
        config.mlp_bias = arch == "llama"
        torch.manual_seed(0)
        model = cls(config, lambda spec, i: torch.nn.Identity())
        for p in model.parameters():
            p.data.normal_(0.0, 0.1)
        model.to(dtype)
        shapes = {tuple(w.shape) for _, w in gemv_layers(model)}
        gate_up = tuple(model.layers[0].mlp.gate_up_proj.weight.shape)
        down = tuple(model.layers[0].mlp.down_proj.weight.shape)
        swiglu = (
            {
                (*gate_up, m): SiluMulChoice(*gate_up, m, 2.0, "cuBLAS + silu_and_mul", 1.0, cfg(m), True)
                for m in DECODE_MS
            }
            if epilogue
            else {}
        )
        GemvPlan(
            {(n, k, m): GemvChoice(n, k, m, 2.0, 1.0, cfg(m), True) for n, k in shapes for m in DECODE_MS},
            silu_mul={(*down, m): SiluMulChoice(*down, m, 2.0, "cuBLAS", 1.0, cfg(m), True) for m in DECODE_MS},
            swiglu=swiglu,
        ).install(model)
        yield arch, model, dtype


def silu_mul_mlp_outputs() -> dict[str, tuple[torch.Tensor, torch.Tensor, list[int]]]:
    """``name -> (MLP output, reference, row counts the fused GEMV saw)`` for each layer's MLP of a tiny
    Llama (float32, MLP bias) and Qwen3 (bfloat16) after a plan that picks the fused SwiGLU GEMV at every
    bucket and the plain Triton GEMV (same config) everywhere. Reference: 1, 3 and 40 rows, the plain GEMV
    (the bucket's config) of the ``silu_and_mul`` kernel's output (bitwise the same); 65 rows, past the
    tables: ``SiluAndMul`` then ``F.linear``."""
    import torch.nn.functional as F

    from attnserve.kernels import triton_fused_ops
    from attnserve.gemv.choices import MAX_ROWS
    from attnserve.kernels.triton_gemv import gemv

    out = {}
    cfg = bucket_config(32)
    for arch, model, dtype in _tiny_mlp_models(cfg, epilogue=False):
        for i, layer in enumerate(model.layers):
            mlp = layer.mlp
            seen: list[int] = []

            def record(f, seen=seen):
                return None if f is None else lambda gu, w, b: (seen.append(gu.shape[0]), f(gu, w, b))[1]

            mlp.mlp_method = type(mlp.mlp_method)(None, tuple(record(f) for f in mlp.mlp_method.silu_mul))
            for rows in ROUTED_ROWS:
                x = torch.randn(rows, model.config.hidden_size).to(dtype)
                seen.clear()
                got = mlp(x)
                gate_up = mlp.gate_up_proj(x)
                if rows <= MAX_ROWS:
                    act = triton_fused_ops.silu_and_mul(gate_up)
                    want = gemv(act, mlp.down_proj.weight, mlp.down_proj.bias, cfg(bucket(rows)))
                else:
                    want = F.linear(mlp.act(gate_up), mlp.down_proj.weight, mlp.down_proj.bias)
                out[f"{arch}.layers.{i}.mlp.rows{rows}"] = (got, want, list(seen))
    return out


def swiglu_mlp_outputs() -> dict[str, tuple[torch.Tensor, torch.Tensor, list[int], list[int]]]:
    """``name -> (MLP output, reference, row counts the gate/up epilogue GEMV saw, row counts down's SwiGLU
    prologue GEMV saw)`` for each layer's MLP of a tiny Llama (float32, MLP bias) and Qwen3 (bfloat16) after a
    plan that picks the GEMV with the SwiGLU epilogue for gate/up at every bucket, the plain Triton GEMV (same
    config) everywhere, and (set by hand: a measured plan keeps one of the two) down's SwiGLU prologue too.
    Reference: 1, 3 and 40 rows, the ``silu_and_mul`` kernel of gate/up's plain GEMV (the bucket's config,
    bitwise the epilogue's output), then down's plain GEMV; 65 rows, past the tables: the layers and
    ``SiluAndMul``."""
    import torch.nn.functional as F

    from attnserve.kernels import triton_fused_ops
    from attnserve.gemv.choices import MAX_ROWS
    from attnserve.kernels.triton_gemv import gemv

    out = {}
    cfg = bucket_config(32)
    for arch, model, dtype in _tiny_mlp_models(cfg, epilogue=True):
        for i, layer in enumerate(model.layers):
            mlp = layer.mlp
            seen_up: list[int] = []
            seen_down: list[int] = []

            def record(f, seen):
                return None if f is None else lambda a, w, b: (seen.append(a.shape[0]), f(a, w, b))[1]

            method = mlp.mlp_method
            mlp.mlp_method = type(method)(
                tuple(record(f, seen_up) for f in method.swiglu), tuple(record(f, seen_down) for f in method.silu_mul)
            )
            for rows in ROUTED_ROWS:
                x = torch.randn(rows, model.config.hidden_size).to(dtype)
                seen_up.clear()
                seen_down.clear()
                got = mlp(x)
                if rows <= MAX_ROWS:
                    up = mlp.gate_up_proj
                    act = triton_fused_ops.silu_and_mul(gemv(x, up.weight, up.bias, cfg(bucket(rows))))
                    want = gemv(act, mlp.down_proj.weight, mlp.down_proj.bias, cfg(bucket(rows)))
                else:
                    want = F.linear(mlp.act(mlp.gate_up_proj(x)), mlp.down_proj.weight, mlp.down_proj.bias)
                out[f"{arch}.layers.{i}.mlp.rows{rows}"] = (got, want, list(seen_up), list(seen_down))
    return out


def main(src: str, dst: str) -> None:
    from attnserve.kernels import triton_gemv

    cases = torch.load(src)
    out = {
        name: run_silu_mul_pair(case)
        if case.get("act") == "silu_mul"
        else run_swiglu_triple(case)
        if case.get("out_act") == "silu_mul"
        else run(case, triton_gemv.gemv)
        for name, case in cases.items()
    }
    out["__counters__"] = triton_gemv.prepare("cpu").clone()
    out["__layers__"] = layer_outputs()
    out["__silu_mul_mlp__"] = silu_mul_mlp_outputs()
    out["__swiglu_mlp__"] = swiglu_mlp_outputs()
    torch.save(out, dst)


if __name__ == "__main__":
    main(*sys.argv[1:3])
