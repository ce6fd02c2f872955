"""A stand-in for the ``flashinfer`` package on machines without it (CPU): the two wrappers the FLASHINFER
backend uses, with FlashInfer's argument contract and computing attention from the page arrays they hold.

``run()`` reads the wrapper's *device-side* ``indptr``/``indices``/``last_page_len`` buffers, as the
kernels do, and computes ``reference_paged_attention`` from them: wrong page arrays give wrong outputs.
``plan()`` checks what FlashInfer's plan() needs (host ``indptr``/``last_page_len``, the CUDA-graph
batch size and buffer bounds) and records every call; the fake C++ planner (``_cached_module.plan``)
checks the tensor-core planner's 20 arguments. A CUDA-graph wrapper's "launch layout" (what plan()
returns) depends on the batch size and ``disable_split_kv`` only, as FlashInfer's does.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from attnserve.attention.ops.reference import reference_paged_attention


def _csr_to_table(indptr, indices, last_page_len, page):
    """(seq_lens, block_table) of the requests a CSR page description holds."""
    indptr, last_page_len = indptr.cpu().long(), last_page_len.cpu().long()
    n = len(last_page_len)
    pages = indptr[1:] - indptr[:-1]
    assert (pages >= 1).all() and (last_page_len >= 1).all() and (last_page_len <= page).all()
    seq_lens = (pages - 1) * page + last_page_len
    table = torch.zeros(n, int(pages.max()), dtype=torch.long)
    idx = indices.cpu().long()
    for i in range(n):
        table[i, : pages[i]] = idx[indptr[i]: indptr[i + 1]]
    return seq_lens, table


def _attend(q, kv_cache, layout, qsl, indptr, indices, last_page_len, page, scale, window_left, softcap, causal):
    seq_lens, table = _csr_to_table(indptr, indices, last_page_len, page)
    cache = kv_cache.transpose(0, 1)  # (2, N, B, H, D) or (2, N, H, B, D)
    if layout == "HND":
        cache = cache.transpose(2, 3)
    if not causal:  # decode: one query per request, the last position
        assert q.shape[0] == len(seq_lens)
    return reference_paged_attention(
        q.float(), cache.float(), torch.as_tensor(qsl), seq_lens, table, scale,
        sliding_window=window_left + 1 if window_left >= 0 else None, logits_soft_cap=softcap or None)


class _Module:
    """The C++ planner of a tensor-core decode wrapper (``module.plan``)."""

    def __init__(self, wrapper):
        self.wrapper = wrapper
        self.calls: list[list] = []

    def plan(self, *args):
        assert len(args) == 20, f"fa2 planner takes 20 arguments, got {len(args)}"
        w = self.wrapper
        (float_ws, int_ws, pinned, qo_indptr, kv_indptr, kv_lens, total_rows, bs, hq, hkv, page, cuda_graph,
         dq, dv, causal, window, fixed_split, disable_split, colocated, uniform_q) = args
        assert float_ws is w._float_workspace_buffer and int_ws is w._int_workspace_buffer
        assert pinned.device.type == "cpu" and pinned.numel() >= int_ws.numel()
        for t in (qo_indptr, kv_indptr, kv_lens):
            assert t.device.type == "cpu" and t.dtype == torch.int32
        assert len(qo_indptr) == len(kv_indptr) == bs + 1 and len(kv_lens) == bs == total_rows
        assert (qo_indptr == torch.arange(bs + 1, dtype=torch.int32)).all()
        assert cuda_graph is True and causal is False and (hq, hkv) == (w._num_qo_heads, w._num_kv_heads)
        self.calls.append(list(args))
        return w._layout_info(bs, bool(disable_split))


class BatchDecodeWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = torch.empty(4096, dtype=torch.uint8, device=float_workspace_buffer.device)
        self._pin_memory_int_workspace_buffer = torch.empty(4096, dtype=torch.uint8)
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._use_tensor_cores = use_tensor_cores
        self._backend = "fa2" if use_tensor_cores and backend in ("auto", "fa2") else backend
        self._jit_module = None
        self._plan_info = None
        self._cached_module = _Module(self)
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._fixed_batch_size = len(paged_kv_last_page_len_buffer) if use_cuda_graph else 0
        self.plans: list[dict] = []

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def _layout_info(self, bs, disable_split_kv):
        return [bs, int(not disable_split_kv), 16]

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             window_left=-1, logits_soft_cap=None, q_data_type="float16", kv_data_type=None, sm_scale=None,
             seq_lens=None, disable_split_kv=False, non_blocking=True):
        assert indptr.device.type == "cpu" and last_page_len.device.type == "cpu", "plan() wants host indptr"
        assert indptr.dtype == last_page_len.dtype == torch.int32
        bs = len(last_page_len)
        assert len(indptr) == bs + 1 and len(indices) == int(indptr[-1])
        if seq_lens is not None:
            assert seq_lens.device.type == "cpu" and len(seq_lens) == bs
            pages = indptr[1:] - indptr[:-1]
            assert ((pages - 1) * page_size + last_page_len == seq_lens).all()
        if self._use_cuda_graph:
            assert bs == self._fixed_batch_size and len(indices) <= len(self._paged_kv_indices_buf)
            self._paged_kv_indptr_buf.copy_(indptr)
            self._paged_kv_last_page_len_buf.copy_(last_page_len)
            self._paged_kv_indices_buf[: len(indices)].copy_(indices)
        else:
            dev = self._float_workspace_buffer.device
            self._paged_kv_indptr_buf, self._paged_kv_indices_buf = indptr.to(dev), indices.to(dev)
            self._paged_kv_last_page_len_buf = last_page_len.to(dev)
        self._num_qo_heads, self._num_kv_heads, self._page_size = num_qo_heads, num_kv_heads, page_size
        self._window_left, self._logits_soft_cap, self._sm_scale = window_left, logits_soft_cap, sm_scale
        self._plan_info = self._layout_info(bs, disable_split_kv) if self._use_tensor_cores else [bs]
        self.plans.append(dict(indptr=indptr.clone(), last=last_page_len.clone(), disable_split_kv=disable_split_kv,
                               pinned=self._pin_memory_int_workspace_buffer))

    def run(self, q, paged_kv_cache, *, out=None, k_scale=None, v_scale=None):
        bs = len(self._paged_kv_last_page_len_buf)
        scale = (self._sm_scale or q.shape[-1] ** -0.5) * (k_scale or 1.0)
        res = _attend(q, paged_kv_cache, self._kv_layout, torch.arange(bs + 1), self._paged_kv_indptr_buf,
                      self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf, self._page_size, scale,
                      self._window_left, self._logits_soft_cap, causal=False) * (v_scale or 1.0)
        if out is None:
            return res.to(q.dtype)
        assert out.shape == q.shape
        out.copy_(res)
        return out


class BatchPrefillWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", backend="auto"):
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = torch.empty(4096, dtype=torch.uint8, device=float_workspace_buffer.device)
        self._pin_memory_int_workspace_buffer = torch.empty(4096, dtype=torch.uint8)
        self._kv_layout = kv_layout
        self.plans: list[dict] = []

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, *, causal=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, q_data_type="float16", kv_data_type=None, o_data_type=None, seq_lens=None,
             non_blocking=True):
        for t in (qo_indptr, paged_kv_indptr, paged_kv_last_page_len):
            assert t.device.type == "cpu" and t.dtype == torch.int32, "plan() wants host indptr"
        assert causal and len(paged_kv_indices) == int(paged_kv_indptr[-1])
        if seq_lens is not None:
            assert seq_lens.device.type == "cpu" and len(seq_lens) == len(paged_kv_last_page_len)
        dev = self._float_workspace_buffer.device
        self._qo = qo_indptr.clone()
        self._indptr, self._indices = paged_kv_indptr.to(dev), paged_kv_indices.to(dev)
        self._last = paged_kv_last_page_len.to(dev)
        self._page_size, self._sm_scale = page_size, sm_scale
        self._window_left, self._logits_soft_cap = window_left, logits_soft_cap
        self.plans.append(dict(qo=qo_indptr.clone(), indptr=paged_kv_indptr.clone()))

    def run(self, q, paged_kv_cache, *, out=None, q_scale=None, k_scale=None, v_scale=None):
        scale = (self._sm_scale or q.shape[-1] ** -0.5) * (q_scale or 1.0) * (k_scale or 1.0)
        res = _attend(q, paged_kv_cache, self._kv_layout, self._qo, self._indptr, self._indices, self._last,
                      self._page_size, scale, self._window_left, self._logits_soft_cap, causal=True)
        res = res * (v_scale or 1.0)
        if out is None:
            return res.to(q.dtype)
        out.copy_(res)
        return out


def module() -> SimpleNamespace:
    """The fake package, for ``sys.modules["flashinfer"]``."""
    return SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=BatchDecodeWithPagedKVCacheWrapper,
                           BatchPrefillWithPagedKVCacheWrapper=BatchPrefillWithPagedKVCacheWrapper)
