"""The fused RoPE + KV-cache write on the GPU (run on the H200: ``pytest tests/gpu/test_rope_kv_write_gpu.py
-m gpu -s``), compiled, where the interpreter tests (tests/kernels/test_rope_kv_write.py,
tests/attention/test_kv_write_target.py) cannot reach:

* the kernel: bitwise equal to ``_rope_kernel`` then ``reshape_and_cache`` on every case of
  ``tests/kernels/rope_kv_cases.py`` (the q/k norm's float32 sums must add in the same order in both), and
  inside a CUDA graph;
* every installed GPU backend (FLASH_ATTN 2/3/4, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION): one step through
  ``Attention.forward_with_rope`` equals RoPE then ``Attention.forward`` bit for bit (output, q/k, cache),
  decode, prefill and mixed batches, with and without q/k norm, fp8 caches where the backend has them;
* tiny Llama 3 and Qwen3 models through the engine (eager prefills, CUDA-graph decodes): the same logits and
  KV caches as with the unfused layer.
"""

from __future__ import annotations

import gc

import pytest
import torch

from tests.gpu.backends import gpu_targets
from tests.gpu.cases import run_rope_paths

pytestmark = pytest.mark.gpu


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


# --------------------------------------------------------------------------------------------- the kernel
@pytest.fixture(scope="module")
def cuda_cases() -> dict:
    from tests.kernels.rope_kv_cases import make_cases

    return make_cases("cuda")


def _names() -> list[str]:
    from tests.kernels.rope_kv_cases import make_cases

    return list(make_cases()) if torch.cuda.is_available() else []


@pytest.mark.parametrize("name", _names())
def test_fused_kernel_equals_rope_then_reshape_and_cache_on_cuda(name, cuda_cases):
    from attnserve.kernels.kv_write import write_kv_torch
    from tests.kernels.rope_kv_cases import run, views

    case = cuda_cases[name]
    (qkv, *caches), (qkv_two, *caches_two) = run(case, "fused"), run(case, "two")
    assert torch.equal(qkv, qkv_two)
    for cache, cache_two in zip(caches, caches_two, strict=True):
        assert torch.equal(bits(cache), bits(cache_two))
    # and against the PyTorch KV write of the kernel's own k: exact, up to one e4m3 step in an fp8 cache
    # (Triton's float32 division is the 2-ulp div.full, PyTorch's the IEEE one)
    want = tuple(c.clone() for c in case["caches"])
    target = views(case, case["qkv"], want)[3]
    _, k, v, _ = views(case, qkv, caches)
    write_kv_torch(k, v, target.key_cache, target.value_cache, target.slot_mapping, target.k_scale, target.v_scale)
    for cache, w in zip(caches, want):
        if w.dtype.itemsize > 1:
            assert torch.equal(cache, w)
        else:
            assert bool(((cache.float() - w.float()).abs() <= w.float().abs() / 8 + 2.0**-9).all())


def test_fused_kernel_replays_in_a_cuda_graph(cuda_cases):
    """Captured after a warm-up, the kernel reads new positions, q/k/v and slots on every replay."""
    from attnserve.kernels import fused_ops
    from tests.kernels.rope_kv_cases import run, views

    case = cuda_cases["cacheN2-HND-norm-bf16"]
    qkv, caches = case["qkv"].clone(), tuple(c.clone() for c in case["caches"])
    positions, slots = case["positions"].clone(), case["slots"].clone()
    q, k, v, target = views({**case, "slots": slots}, qkv, caches)

    def step():
        fused_ops.rotary_embedding_kv_write(
            positions, q, k, v, case["cos"], case["sin"], target, case["q_norm"], case["k_norm"]
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    new = {
        **case,
        "positions": torch.randint(0, 1024, positions.shape, device="cuda"),
        "slots": slots.flip(0),
        "qkv": torch.randn_like(qkv),
    }
    positions.copy_(new["positions"])
    slots.copy_(new["slots"])
    qkv.copy_(new["qkv"])
    for c, given in zip(caches, case["caches"]):
        c.copy_(given)
    graph.replay()
    torch.cuda.synchronize()
    want_qkv, *want_caches = run(new, "two")
    assert torch.equal(qkv, want_qkv)
    assert all(torch.equal(c, w) for c, w in zip(caches, want_caches, strict=True))


# ------------------------------------------------------------------------------------------- the backends
_SHAPES = ("decode_b64", "prefill", "mixed")


def _backend_params() -> list:
    """Per installed target: its decode/prefill/mixed cases in its first dtype, and its fp8 and non-NHD
    variants; with q/k norm on all, without on the first."""
    params = []
    for label, name, cfg, cases in gpu_targets() if torch.cuda.is_available() else []:
        first = cases[0].dtype
        picked = [
            c
            for c in cases
            if c.shape in _SHAPES and c.sliding_window is None and (c.dtype == first or c.kv_cache_dtype != "auto")
        ]
        for i, case in enumerate(picked):
            for qk_norm in (False, True) if i == 0 else (True,):
                params.append(
                    pytest.param(
                        label, name, cfg, case, qk_norm, id=f"{label}-{case.name}-{'qk_norm' if qk_norm else 'rope'}"
                    )
                )
    return params


@pytest.mark.parametrize("label,backend_name,attention_config,case,qk_norm", _backend_params())
def test_forward_with_rope_equals_rope_then_forward(label, backend_name, attention_config, case, qk_norm):
    from attnserve.attention.registry import AttentionBackendEnum

    backend_cls = AttentionBackendEnum[backend_name].get_class()
    results = run_rope_paths(backend_cls, case, "cuda", attention_config, qk_norm=qk_norm)
    for what, a, b in zip(("output", "qkv", "kv cache"), results["unfused"], results["fused"], strict=True):
        assert torch.equal(bits(a), bits(b)), f"{label} {case.name}: {what} differs"


# ---------------------------------------------------------------------------------------------- the models
MODEL_BACKENDS = [("FLASH_ATTN", {}), ("FLASHINFER", {}), ("TRITON_ATTN", {})]


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory, default_tokenizer):
    from tests.models.tiny import make_tiny_model

    made: dict[str, str] = {}

    def make(arch: str) -> str:
        if arch not in made:  # 4 heads of 64: a head size every GPU backend supports
            made[arch] = make_tiny_model(arch, tmp_path_factory.mktemp(f"rope-kv-{arch}"), default_tokenizer, 256)
        return made[arch]

    return make


def _engine_run(
    path: str, backend: str, cfg: dict, unfused: bool, monkeypatch, device: str = "cuda", dtype: str = "bfloat16"
) -> list[torch.Tensor]:
    """Prefill two prompts (eager), chunked prefill + decode (eager), two pure decode steps (CUDA graphs):
    the logits of each step and the KV caches after them. ``unfused``: the layers run RoPE then
    ``Attention.forward`` (patched before the engine is built, so its graphs capture that path too)."""
    from attnserve import LLM, SamplingParams
    from attnserve.attention.layer import Attention
    from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput

    with monkeypatch.context() as m:
        if unfused:

            def forward_with_rope(self, query, key, value, batch, rope):
                rope.apply(query, key)
                return self.forward(query, key, value, batch)

            m.setattr(Attention, "forward_with_rope", forward_with_rope)
        llm = LLM(
            path,
            dtype=dtype,
            device=device,
            block_size=16,
            kv_cache_memory=64 << 20,
            max_num_seqs=8,
            attention_backend=backend,
            attention_config=cfg,
        )
        runner = llm.engine.runner
        p = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        a, b = list(range(100, 130)), list(range(2000, 2021))
        ta, tb = [5, 2], [7, 1]
        steps = [
            [("a", a, 0, ta), ("b", b[:13], 0, tb)],
            [("a", [17], 30, ta), ("b", b[13:], 13, tb)],
            [("a", [18], 31, ta), ("b", [23], 21, tb)],
            [("a", [19], 32, ta + [3]), ("b", [24], 22, tb)],
        ]
        replays = runner.cuda_graphs.replays if runner.cuda_graphs else 0
        out = [
            runner.compute_logits(SchedulerOutput([ScheduledRequest(r, t, s, blk, p, True) for r, t, s, blk in st]))
            .float()
            .cpu()
            for st in steps
        ]
        if runner.cuda_graphs is not None:
            assert runner.cuda_graphs.replays == replays + 2  # the two pure-decode steps
        out += [c.cpu() for c in runner.kv_caches]
        runner.release()
        del llm
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


@pytest.mark.parametrize("arch", ["llama3", "qwen3"])
@pytest.mark.parametrize("backend,cfg", MODEL_BACKENDS, ids=[b for b, _ in MODEL_BACKENDS])
def test_model_logits_and_cache_fused_equal_unfused(arch, backend, cfg, gpu_model_dir, monkeypatch):
    from tests.gpu.backends import _has

    needs = {
        "FLASH_ATTN": ("flash_attn_interface", "flash_attn.cute"),
        "FLASHINFER": ("flashinfer",),
        "TRITON_ATTN": ("triton",),
    }[backend]  # FlashAttention 2 needs block size 256: not this test's 16
    if not any(_has(m) for m in needs):
        pytest.skip(f"{backend} not installed")
    path = gpu_model_dir(arch)
    fused = _engine_run(path, backend, cfg, False, monkeypatch)
    unfused = _engine_run(path, backend, cfg, True, monkeypatch)
    for i, (got, want) in enumerate(zip(fused, unfused, strict=True)):
        assert torch.equal(bits(got), bits(want)), f"{arch} {backend}: {'step logits' if i < 4 else 'cache'} {i}"
