"""FLEX_ATTENTION: torch's ``flex_attention`` over the paged KV cache, with a block mask from block tables.

The step's query tokens are one query sequence and the key sequence is made of cache blocks. On CUDA the
key sequence is the layer's whole cache (``num_blocks * block_size`` slots): the compiled kernel visits
only the blocks the mask lists. On CPU flex_attention runs eagerly, and eager flex_attention scores every
query against every key (it ignores the mask's block structure), so there the key sequence is only the
blocks the step's requests own, gathered from the cache in block-id order: each step then costs in
proportion to the blocks in use, not to the cache size. Once per step the builder turns the block tables
into a ``BlockMask`` directly (no dense mask): for each tile of 16 query tokens, the key blocks its
requests own; the mask function maps a key slot to its request's logical position (a key-block-to-logical
block map) and applies causality and the sliding window. ``use_prefill_decode_attention`` makes two flex
calls (decode tokens, prefill tokens).

Limits: CUDA and CPU; any head size and block size; float32, float16, bfloat16; KV cache in the model
dtype only (no fp8); sliding window through the mask; logits soft cap through a ``score_mod`` (vLLM's
FlexAttention rejects it); no sinks; no CUDA graphs. Needs ``torch.nn.attention.flex_attention`` (torch >= 2.5); on CUDA,
torch.compile generates its kernels with Triton, so Triton is needed there too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from attnserve.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    CudaGraphSupport,
)
from attnserve.kernels.kv_write import KVWriteTarget, kv_views
from attnserve.attention.validation import package_installed
from attnserve.refusals import Reason
from attnserve.refusals.backends import not_installed


class FlexAttentionBackend(AttentionBackend):
    name: ClassVar[str] = "FLEX_ATTENTION"
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    supported_kv_cache_dtypes = ("auto",)
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True  # from flex_attention's log-sum-exp (FlexAttentionImpl.forward)
    supported_attn_types = (AttentionType.DECODER, AttentionType.ENCODER_ONLY)
    device_types = ("cuda", "cpu")
    required_package = "torch.nn.attention.flex_attention"
    install_hint = "pip install 'torch>=2.5'"
    cuda_graph_support = CudaGraphSupport.NEVER

    @staticmethod
    def get_impl_cls() -> type["FlexAttentionImpl"]:
        return FlexAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["FlexAttentionMetadataBuilder"]:
        return FlexAttentionMetadataBuilder

    @classmethod
    def validate(cls, selector_config, platform, attention_config=None, assume_installed=False) -> list[Reason]:
        reasons = super().validate(selector_config, platform, attention_config, assume_installed)
        if platform.device_type == "cuda" and not assume_installed and not package_installed("triton"):
            reasons.append(
                not_installed(
                    "triton", "pip install 'attnserve[triton]'", "flex_attention compiles with Triton on CUDA"
                )
            )
        return reasons


Q_TILE = 16  # query tokens per block-mask row (and kernel BLOCK_M)
_COMPILED: dict[str, Any] = {}


def _eager_flex(*args, **kwargs):
    """Eager flex_attention (CPU) without torch's per-call advice to compile it: eager is our choice there,
    and a user of ``attnserve generate`` cannot act on that warning."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(*args, **kwargs)


def _flex_fn(device: torch.device):
    """flex_attention, compiled once per process on CUDA (dynamic shapes: the token count changes every step)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return _eager_flex
    if "cuda" not in _COMPILED:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        _COMPILED["cuda"] = torch.compile(flex_attention, fullgraph=True, dynamic=True)
    return _COMPILED["cuda"]


@dataclass
class FlexAttentionCall:
    query_start: int  # tokens [query_start, query_end) of the step
    query_end: int
    padded_len: int  # query length rounded up to Q_TILE
    block_mask: Any  # torch BlockMask over (padded_len, key blocks * block_size)
    kv_blocks: torch.Tensor | None = None  # the cache blocks that make the key sequence; None: the whole cache


@dataclass
class FlexAttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) int64
    calls: list[FlexAttentionCall]


class FlexAttentionMetadataBuilder(AttentionMetadataBuilder):
    """Builds the BlockMask (one per kernel call) from the block tables, once per step.

    ``gather_kv`` (default: on any device but CUDA, where flex_attention runs eagerly): the key sequence is
    the call's own blocks (sorted physical ids, ``FlexAttentionCall.kv_blocks``), gathered by the impl.
    Otherwise the key sequence is the whole cache: ``num_cache_blocks`` (the cache's block count) sizes
    it; the runner sets it. Unset, the mask covers blocks up to the largest id in the table and the impl
    widens it to the cache.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from torch.nn.attention.flex_attention import BlockMask

        self.BlockMask = BlockMask
        cfg = self.attention_config
        self.prefill_decode = bool(cfg is not None and cfg.use_prefill_decode_attention)
        self.num_cache_blocks: int | None = None
        self.gather_kv = self.device.type != "cuda"

    def build(self, common: CommonAttentionMetadata) -> FlexAttentionMetadata:
        nd, b = common.num_decodes, common.num_reqs
        ranges = [(0, nd), (nd, b)] if self.prefill_decode and 0 < nd < b else [(0, b)]
        return FlexAttentionMetadata(common.slot_mapping, [self._call(common, lo, hi) for lo, hi in ranges])

    def _call(self, common: CommonAttentionMetadata, first: int, last: int) -> FlexAttentionCall:
        dev, bs = self.device, common.block_size
        qsl = common.query_start_loc_cpu.tolist()
        seq_lens = common.seq_lens_cpu.tolist()
        q0, q1 = qsl[first], qsl[last]
        n_q = q1 - q0
        padded = -(-n_q // Q_TILE) * Q_TILE
        n_tiles = padded // Q_TILE
        table = common.block_table[first:last].long()
        nblocks = torch.tensor([-(-s // bs) for s in seq_lens[first:last]], device=dev)
        j = torch.arange(table.shape[1], device=dev)
        owned = j[None, :] < nblocks[:, None]  # (n, max_blocks)
        kv_blocks = None
        if self.gather_kv:  # key block k = physical block kv_blocks[k]
            kv_blocks = torch.unique(table[owned])  # sorted
            table = torch.searchsorted(kv_blocks, table).clamp_(max=len(kv_blocks) - 1)  # not-owned: unused
            num_blocks = len(kv_blocks)
        else:  # key block = physical block
            num_blocks = self.num_cache_blocks or int(table[owned].max()) + 1
        # per query token: request (relative) and absolute position; padding tokens see nothing
        q_lens = [qsl[i + 1] - qsl[i] for i in range(first, last)]
        token_req = torch.repeat_interleave(torch.arange(last - first), torch.tensor(q_lens))
        token_pos = torch.cat(
            [torch.arange(seq_lens[i] - ql, seq_lens[i]) for i, ql in zip(range(first, last), q_lens)]
        )
        token_req = torch.cat([token_req, torch.zeros(padded - n_q, dtype=torch.long)]).to(dev, torch.int32)
        token_pos = torch.cat([token_pos, torch.full((padded - n_q,), -1)]).to(dev, torch.int32)
        # key block -> logical block index within each request (-1: not its block)
        p2l = torch.full((last - first, num_blocks), -1, dtype=torch.int32, device=dev)
        rows = torch.arange(last - first, device=dev)[:, None].expand_as(table)
        p2l[rows[owned], table[owned]] = j[None, :].expand_as(table)[owned].to(torch.int32)
        # query tile -> the key blocks of the requests it holds
        pair_tile, pair_req = [], []
        for i in range(first, last):
            lo, hi = (qsl[i] - q0) // Q_TILE, (qsl[i + 1] - q0 - 1) // Q_TILE
            pair_tile += range(lo, hi + 1)
            pair_req += [i - first] * (hi - lo + 1)
        pair_tile = torch.tensor(pair_tile, device=dev)
        pair_req = torch.tensor(pair_req, device=dev)
        pt = pair_tile[:, None].expand(-1, table.shape[1])
        po = owned[pair_req]
        used = torch.zeros(n_tiles, num_blocks, dtype=torch.int8, device=dev)
        used[pt[po], table[pair_req][po]] = 1
        kv_num_blocks = used.sum(-1, dtype=torch.int32)
        kv_indices = torch.argsort(used, dim=-1, descending=True, stable=True).to(torch.int32)
        window = self.layer_spec.sliding_window

        def mask_mod(b, h, q_idx, kv_idx):
            r = token_req[q_idx]
            blk = kv_idx // bs
            logical = p2l[r, torch.clamp(blk, max=num_blocks - 1)]  # eager mode evaluates every slot
            pos = logical * bs + kv_idx % bs
            ok = (blk < num_blocks) & (logical >= 0) & (pos <= token_pos[q_idx])
            if window is not None:
                ok = ok & (pos > token_pos[q_idx] - window)
            return ok

        mask = self.BlockMask.from_kv_blocks(
            kv_num_blocks[None, None],
            kv_indices[None, None],
            BLOCK_SIZE=(Q_TILE, bs),
            mask_mod=mask_mod,
            seq_lengths=(padded, num_blocks * bs),
        )
        return FlexAttentionCall(q0, q1, padded, mask, kv_blocks)


class FlexAttentionImpl(AttentionImpl):
    """Writes K/V, then one flex_attention call per metadata call: the key sequence is the call's gathered
    blocks (``kv_blocks``) or the whole cache. A logits soft cap C is a ``score_mod`` on the scaled scores,
    ``C * tanh(s / C)``, before the mask. Sinks: the output is scaled by ``exp(lse) / (exp(lse) + exp(sink))`` =
    ``sigmoid(lse - sink)``, the share the keys keep once the sink joins the softmax."""

    supports_sinks = True

    def __init__(self, spec, attention_config=None) -> None:
        super().__init__(spec, attention_config)
        cap = spec.logits_soft_cap
        self._cap = None if cap is None else float(cap)

    def kv_write_target(self, kv_cache, metadata: FlexAttentionMetadata) -> KVWriteTarget:
        return KVWriteTarget(*kv_views(kv_cache, 0), metadata.slot_mapping)

    def forward(
        self, query, key, value, kv_cache, metadata: FlexAttentionMetadata, kv_written: bool = False
    ) -> torch.Tensor:
        key_cache, value_cache = kv_views(kv_cache, 0)
        if not kv_written:
            self.kv_write_target(kv_cache, metadata).write(key, value)
        n_slots = key_cache.shape[0] * key_cache.shape[1]
        whole_k = whole_v = None
        flex = _flex_fn(query.device)
        kernel_options = {"BLOCK_M": Q_TILE, "BLOCK_N": 16, "FORCE_USE_FLEX_ATTENTION": True} if query.is_cuda else None
        out = torch.empty_like(query)
        score_mod = None if self._cap is None else _soft_cap_mod(self._cap, query.device)
        for call in metadata.calls:
            n = call.query_end - call.query_start
            q = query.new_zeros(call.padded_len, self.num_heads, self.head_size)
            q[:n] = query[call.query_start : call.query_end]
            mask = call.block_mask
            if call.kv_blocks is not None:
                k, v = _keys(key_cache[call.kv_blocks]), _keys(value_cache[call.kv_blocks])
            else:
                if whole_k is None:
                    whole_k, whole_v = _keys(key_cache), _keys(value_cache)
                k, v = whole_k, whole_v
                if mask.seq_lengths[1] != n_slots:  # built without the cache size: same blocks, full key length
                    mask = _resize_kv(mask, n_slots)
            o = flex(
                q.transpose(0, 1)[None],
                k,
                v,
                block_mask=mask,
                scale=self.scale,
                score_mod=score_mod,
                enable_gqa=self.num_heads != self.num_kv_heads,
                kernel_options=kernel_options,
                **({} if self.sinks is None else _lse_request()),
            )
            if self.sinks is not None:  # o (1, Hq, L, D), lse (1, Hq, L) natural log
                o, aux = o
                lse = getattr(aux, "lse", aux)
                o = o * torch.sigmoid(lse - self.sinks.float()[:, None])[..., None].to(o.dtype)
            out[call.query_start : call.query_end] = o[0].transpose(0, 1)[:n]
        return out


@functools.cache
def _soft_cap_mod(cap: float, device: torch.device):
    """The ``score_mod`` ``cap * tanh(score / cap)``: one function per cap value and device, shared by every
    layer, so that the compiled flex_attention sees the same function (no recompilation per layer). The cap is
    a captured 0-d tensor, not a float: torch.compile lifts a float closure to a graph input read with
    ``.item()``, which Inductor's flex_attention lowering cannot bind (InductorError: unbacked_bindings)."""
    cap_t = torch.tensor(cap, dtype=torch.float32, device=device)

    def soft_cap(score, b, h, q_idx, kv_idx):
        return cap_t * torch.tanh(score / cap_t)

    return soft_cap


def _lse_request() -> dict:
    """flex_attention's argument asking for the log-sum-exp: ``return_aux`` where torch has it (>= 2.9), else
    ``return_lse``."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return {"return_lse": True}
    return {"return_aux": AuxRequest(lse=True)}


def _keys(blocks: torch.Tensor) -> torch.Tensor:
    """(num_blocks, block_size, Hkv, D) -> (1, Hkv, num_blocks * block_size, D): a view for the NHD layout
    of a whole cache, a copy otherwise."""
    n, bs, h, d = blocks.shape
    return blocks.reshape(n * bs, h, d).permute(1, 0, 2)[None]


def _resize_kv(mask, n_slots: int):
    """``mask`` over a key sequence of ``n_slots`` (its block ids already fit)."""
    from torch.nn.attention.flex_attention import BlockMask

    return BlockMask.from_kv_blocks(
        mask.kv_num_blocks,
        mask.kv_indices,
        BLOCK_SIZE=mask.BLOCK_SIZE,
        mask_mod=mask.mask_mod,
        seq_lengths=(mask.seq_lengths[0], n_slots),
    )
