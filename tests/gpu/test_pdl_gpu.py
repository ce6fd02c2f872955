"""Programmatic dependent launch (``attnserve/kernels/pdl.py``) changes when kernels start, never what they compute.

- A chain of dependent kernels in the order a decoder layer runs them (RMSNorm + residual, GEMV, RoPE + KV
  write, GEMV, RMSNorm + residual, GEMV, SwiGLU, GEMV; FMA, tensor-core and split-K GEMV tiles), eight layers
  deep, captured in a CUDA graph with PDL on gives bit for bit
  what the same chain gives with PDL off, over replays on new inputs: a kernel that read its input before
  the kernel producing it had finished would differ.
- The default model's engine with ``enable_pdl`` (CUDA graphs; the same kernels, so the same bits) decodes
  the same greedy tokens and logprobs as without PDL. (Not with ``use_skinny_gemm``: each engine measures
  its own GEMV plan, and two plans may choose different tiles, whose sums round differently.)

``python -m pytest tests/gpu/test_pdl_gpu.py -m gpu -q`` on a GPU of compute capability >= 9.0 (skipped
elsewhere).
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_cuda_graphs import default_gguf  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
        reason="programmatic dependent launch needs compute capability >= 9.0",
    ),
]


def _layer_chain(h, res, w, positions, cos, sin, target, cfgs):
    """One decoder layer's Triton kernels in their order, each reading the one before it."""
    from attnserve.kernels import triton_fused_ops as ops
    from attnserve.kernels.triton_gemv import gemv

    x, res = ops.rms_norm(h, w["norm1"], 1e-6, res)
    qkv = gemv(x, w["qkv"], None, cfgs["qkv"])
    q, k, v = qkv.split([4 * 128, 128, 128], dim=-1)
    q, k, v = q.view(-1, 4, 128), k.view(-1, 1, 128), v.view(-1, 1, 128)
    ops.rotary_embedding_kv_write(positions, q, k, v, cos, sin, target)
    o = gemv(q.reshape(q.shape[0], -1), w["o"], None, cfgs["o"])
    x, res = ops.rms_norm(o, w["norm2"], 1e-6, res)
    gate_up = gemv(x, w["gate_up"], None, cfgs["gate_up"])
    return gemv(ops.silu_and_mul(gate_up), w["down"], None, cfgs["down"]), res


@pytest.mark.parametrize("m,whole_k", [(1, False), (4, False), (64, False), (1, True), (2, True), (4, True)])
def test_pdl_chain_in_a_graph_equals_without_pdl(m, whole_k):
    """``whole_k``: every GEMV takes ``gemv.tiles.whole_k_config``'s one-step tile (its whole weight share
    loaded before the PDL wait)."""
    from attnserve.kernels.kv_write import KVWriteTarget
    from attnserve.kernels import pdl
    from attnserve.kernels.triton_gemv import GemvConfig, prepare

    hidden, inter, layers = 1024, 2048, 8
    g = torch.Generator(device="cuda").manual_seed(m)
    rnd = lambda *s, scale=1.0: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g) * scale  # noqa: E731
    weights = [
        {
            "norm1": rnd(hidden),
            "norm2": rnd(hidden),
            "qkv": rnd(768, hidden, scale=hidden**-0.5),
            "o": rnd(hidden, 512, scale=512**-0.5),
            "gate_up": rnd(2 * inter, hidden, scale=hidden**-0.5),
            "down": rnd(hidden, inter, scale=inter**-0.5),
        }
        for _ in range(layers)
    ]
    dot = m > 2
    cfgs = {
        "qkv": GemvConfig(32 if dot else 8, 128, 1, dot=dot, num_stages=3 if dot else 2),
        "o": GemvConfig(32 if dot else 8, 128, 4, dot=dot, num_stages=3 if dot else 2),  # split-K
        "gate_up": GemvConfig(64 if dot else 16, 256 if dot else 512, 1, dot=dot, num_stages=2),
        "down": GemvConfig(32 if dot else 8, 256, 8, dot=dot, num_stages=2),
    }  # split-K
    if whole_k:
        from attnserve.gemv.tiles import whole_k_config

        shapes = {"qkv": (768, hidden), "o": (hidden, 512), "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
        cfgs = {name: whole_k_config(n, k, m) for name, (n, k) in shapes.items()}
    positions = torch.arange(m, device="cuda") * 7
    inv = 1.0 / (10000 ** (torch.arange(0, 64, device="cuda", dtype=torch.float32) / 64))
    freqs = torch.outer(torch.arange(4096, device="cuda", dtype=torch.float32), inv)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    prepare("cuda")
    h_in, res_in = rnd(m, hidden), rnd(m, hidden)

    def run_graph(pdl_on: bool):
        pdl.configure(pdl_on)
        caches = [
            (
                torch.zeros(64, 16, 1, 128, device="cuda", dtype=torch.bfloat16),
                torch.zeros(64, 16, 1, 128, device="cuda", dtype=torch.bfloat16),
            )
            for _ in range(layers)
        ]
        slots = torch.arange(m, device="cuda", dtype=torch.int64) * 3

        def forward():
            h, res = h_in, res_in
            for w, (kc, vc) in zip(weights, caches):
                h, res = _layer_chain(h, res, w, positions, cos, sin, KVWriteTarget(kc, vc, slots), cfgs)
            return h, res

        forward()  # compile and warm
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward()
        outs = []
        for replay in range(3):
            gen = torch.Generator(device="cuda").manual_seed(100 + replay)
            h_in.copy_(torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16, generator=gen))
            graph.replay()
            torch.cuda.synchronize()
            outs.append((out[0].clone(), out[1].clone(), torch.stack([c for kv in caches for c in kv]).clone()))
        return outs

    try:
        want, got = run_graph(False), run_graph(True)
        for replay, (a, b) in enumerate(zip(want, got)):
            for name, x, y in zip(("hidden", "residual", "kv cache"), a, b):
                assert torch.equal(x, y), (
                    f"m={m} replay {replay}: {name} differs in {int((x != y).sum())} of {x.numel()}"
                )
    finally:
        pdl.configure(False)


def test_engine_with_pdl_decodes_the_same_tokens(default_gguf):
    from attnserve import LLM, SamplingParams
    from tests.gpu.test_cuda_graphs import PROMPTS

    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=2)
    outs = {}
    for on in (False, True):
        llm = LLM(
            default_gguf,
            dtype="bfloat16",
            device="cuda",
            attention_backend="TRITON_ATTN",
            kv_cache_memory=1 << 30,
            max_num_seqs=64,
            enable_pdl=on,
            use_skinny_gemm=False,  # each engine would measure its own plan (PDL is in its key)
        )
        outs[on] = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(PROMPTS, params)]
        del llm
    assert [t for t, _ in outs[True]] == [t for t, _ in outs[False]]
    assert [lp for _, lp in outs[True]] == [lp for _, lp in outs[False]]
