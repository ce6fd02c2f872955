"""Cascade attention on the GPU (FlashAttention 3 and TRITON_ATTN): a decode step whose requests share a prefix of
KV blocks.

- Kernel: a decode step of 16 requests sharing 512 tokens (32 blocks) plus 1-300 of their own; the cascade (prefix
  call + suffix call + merge) and the plain call against the float32 oracle over each request's whole context.
- Engine: a tiny random Llama, bf16, CUDA graphs, 16 prompts sharing 320 tokens: the cascade graphs replay
  (``cascade_replays``) and the greedy tokens equal those with ``disable_cascade_attn`` (or part at a near tie:
  each run's token among the other's two most likely, as in ``test_prefix_caching_gpu.py``).

``python -m pytest tests/gpu/test_cascade_gpu.py -q`` on a GPU (each backend skipped where not installed).
"""

from __future__ import annotations

import gc

import pytest
import torch

from tests.gpu.backends import _has

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# backend -> (attention config fields, the module it needs)
BACKENDS = {"FLASH_ATTN": ({"flash_attn_version": 3}, "flash_attn_interface"), "TRITON_ATTN": ({}, "triton")}


@pytest.fixture(params=list(BACKENDS))
def backend(request) -> str:
    if not _has(BACKENDS[request.param][1]):
        pytest.skip(f"{BACKENDS[request.param][1]} not installed")
    return request.param


# (cached own tokens, new tokens) per request after the shared prefix, 16 requests: the engine runs the cascade on
# decode steps (CUDA graphs) only
STEPS = {
    "decode": [(int(n), 1) for n in torch.randint(0, 300, (16,), generator=torch.Generator().manual_seed(1))],
}


@pytest.mark.parametrize("name", list(STEPS))
def test_cascade_call_matches_the_oracle(name, backend):
    """The cascade call (paged prefix call, suffix call, merge) on a decode step against the float32 oracle."""
    from attnserve.attention.backend import AttentionLayerSpec, CommonAttentionMetadata, KVCacheLayout
    from attnserve.attention.registry import AttentionBackendEnum
    from attnserve.attention.cascade import CascadePrefix
    from attnserve.config.attention import AttentionConfig
    from attnserve.kernels.kv_write import kv_views
    from attnserve.kernels.reference import reference_paged_attention
    from attnserve.model_executor.kv_cache import allocate_kv_caches

    dev, dtype = torch.device("cuda"), torch.bfloat16
    g = torch.Generator().manual_seed(0)
    reqs = STEPS[name]
    b, hq, hkv, d, bs, prefix_blocks = len(reqs), 32, 8, 128, 16, 32
    prefix_len = prefix_blocks * bs
    q_lens = torch.tensor([n for _, n in reqs])
    context = torch.tensor([prefix_len + c for c, _ in reqs])
    seq_lens = context + q_lens
    own_blocks = [-(-int(n - prefix_len) // bs) for n in seq_lens]
    num_blocks = prefix_blocks + sum(own_blocks) + 4
    width = prefix_blocks + max(own_blocks)
    table = torch.zeros(b, width, dtype=torch.int32)
    table[:, :prefix_blocks] = torch.arange(prefix_blocks)
    at = prefix_blocks
    for i, n in enumerate(own_blocks):
        table[i, prefix_blocks : prefix_blocks + n] = torch.arange(at, at + n)
        at += n
    backend_cls = AttentionBackendEnum[backend].get_class()
    kv = allocate_kv_caches(backend_cls, KVCacheLayout.NHD, 1, num_blocks, bs, hkv, d, dtype, dev)[0]
    kv.copy_(torch.randn(kv.shape, generator=g).to(dtype) * 2)
    t = int(q_lens.sum())
    q = (torch.randn(t, hq, d, generator=g) * 2).to(dev, dtype)
    key = (torch.randn(t, hkv, d, generator=g) * 2).to(dev, dtype)
    value = (torch.randn(t, hkv, d, generator=g) * 2).to(dev, dtype)
    pos = torch.cat([torch.arange(int(c), int(s)) for c, s in zip(context, seq_lens)])
    row = torch.repeat_interleave(torch.arange(b), q_lens)
    slots = (table[row, pos // bs].long() * bs + pos % bs).to(dev)
    qsl = torch.zeros(b + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    num_decodes = int((q_lens == 1).sum())
    spec = AttentionLayerSpec(num_heads=hq, head_size=d, scale=d**-0.5, num_kv_heads=hkv)
    cfg = AttentionConfig(**BACKENDS[backend][0])
    builder = backend_cls.get_builder_cls()(spec, dev, dtype, attention_config=cfg)
    impl = backend_cls.get_impl_cls()(spec, attention_config=cfg)
    assert builder.supports_cascade

    def common(tab, lens, cascade=None):
        return CommonAttentionMetadata(
            query_start_loc=qsl.to(dev),
            query_start_loc_cpu=qsl,
            seq_lens=lens.to(dev, torch.int32),
            seq_lens_cpu=lens.to(torch.int32),
            block_table=tab.contiguous().to(dev),
            slot_mapping=slots,
            num_reqs=b,
            num_actual_tokens=t,
            max_query_len=int(q_lens.max()),
            max_seq_len=int(lens.max()),
            num_decodes=num_decodes,
            num_decode_tokens=num_decodes,
            block_size=bs,
            cascade=cascade,
        )

    prefix = CascadePrefix(
        table[:1, :prefix_blocks].contiguous().to(dev),
        torch.tensor([prefix_len], dtype=torch.int32, device=dev),
        torch.tensor([0, t], dtype=torch.int32, device=dev),
        prefix_len,
    )
    plain = impl.forward(q, key, value, kv, builder.build(common(table, seq_lens)))
    metadata = builder.build(common(table[:, prefix_blocks:], seq_lens - prefix_len, prefix))
    if backend == "FLASH_ATTN":
        assert metadata.calls[0].prefix is not None and not metadata.calls[0].fresh
    else:
        assert metadata.calls[0].cascade is not None and len(metadata.calls) == 2
    cascade = impl.forward(q, key, value, kv, metadata)
    kv_both = torch.stack(kv_views(kv, getattr(impl, "kv_dim", 0)))  # (2, N, B, Hkv, D), the oracle's layout
    ref = reference_paged_attention(q, kv_both, qsl, seq_lens, table, d**-0.5)
    scale = ref.float().abs().max().item()
    err_plain = (plain.float() - ref.float()).abs().max().item() / scale
    err_cascade = (cascade.float() - ref.float()).abs().max().item() / scale
    assert err_cascade < 1e-2, (err_cascade, err_plain)
    assert err_plain < 1e-2


def _near_tie(a, b) -> bool:
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)):
        if x != y:
            return y in a.logprobs[i] and x in b.logprobs[i]
    return len(a.token_ids) == len(b.token_ids)


def test_cascade_graphs_give_the_greedy_tokens_of_plain_graphs(gpu_model_dir, backend):
    from attnserve import LLM, SamplingParams

    path = gpu_model_dir("llama3")
    shared = [100 + (i * 37) % 20000 for i in range(320)]
    prompts = [shared + [200 + 13 * i + j for j in range(5 + i)] for i in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    runs = {}
    for disable in (False, True):
        llm = LLM(
            path,
            dtype="bfloat16",
            attention_backend=backend,
            attention_config=BACKENDS[backend][0] or None,
            max_model_len=512,
            kv_cache_memory=256 << 20,
            max_num_seqs=32,
            disable_cascade_attn=disable,
        )
        graphs = llm.engine.runner.cuda_graphs
        assert bool(graphs.cascade_graphs) == (not disable)
        llm.generate(prompts[:1], params)  # the shared prefix is cached before the batch
        runs[disable] = [o.outputs[0] for o in llm.generate(prompts, params)]
        if not disable:
            assert graphs.cascade_replays > 0
        del llm, graphs
        gc.collect()
        torch.cuda.empty_cache()
    on, off = runs[False], runs[True]
    exact = sum(a.token_ids == b.token_ids for a, b in zip(on, off))
    ties = sum(a.token_ids != b.token_ids and _near_tie(a, b) for a, b in zip(on, off))
    assert exact + ties == len(on), (exact, ties)
    assert exact >= len(on) // 2, (exact, ties)
