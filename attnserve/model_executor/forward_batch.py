"""How the model runner builds a step's ForwardBatch (the record itself: ``attention/forward_batch.py``).

The step's inputs are first computed on the host as numpy arrays (:class:`HostBatch`, no torch, no device),
then copied to the device through pinned staging buffers (:class:`PinnedStaging`) with non-blocking copies:
the only host-device synchronisation of a step is reading the sampled tokens back.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnserve.model_executor.block_tables import BlockTableRows

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.forward_batch import ForwardBatch
    from attnserve.core.step import SchedulerOutput


@dataclass
class HostBatch:
    """One step's flattened inputs on the host (numpy). B requests, T query tokens, W block-table width."""

    input_ids: np.ndarray  # (T,) int64
    positions: np.ndarray  # (T,) int64
    slot_mapping: np.ndarray  # (T,) int64, flat KV-cache slot of each token
    query_start_loc: np.ndarray  # (B + 1,) int32
    seq_lens: np.ndarray  # (B,) int32, context length after this step
    block_table: np.ndarray  # (B, W) int32, 0 padding
    num_decodes: int  # requests with query length 1 (all first)
    max_query_len: int
    max_seq_len: int

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def is_pure_decode(self) -> bool:
        return self.num_decodes == self.num_reqs

    @property
    def logits_indices(self) -> np.ndarray:  # (B,) int64, each request's last token
        return self.query_start_loc[1:].astype(np.int64) - 1


def host_batch(sched: "SchedulerOutput", block_size: int, tables: BlockTableRows | None = None) -> HostBatch:
    """Flatten the scheduler's requests into numpy arrays (slot of position p: table[p // bs] * bs + p % bs).
    ``tables``: the runner's block-table rows kept between steps (None: the tables are copied whole)."""
    reqs = sched.requests
    n = len(reqs)
    query_lens = np.fromiter((len(r.token_ids) for r in reqs), dtype=np.int64, count=n)
    starts = np.fromiter((r.start_position for r in reqs), dtype=np.int64, count=n)
    seq_lens = starts + query_lens
    qsl = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(query_lens, out=qsl[1:])
    block_table = (tables if tables is not None else BlockTableRows(n, 1)).gather(reqs)
    num_tokens = int(qsl[-1])
    if num_tokens == n:  # pure decode: one token per request, no repeat/gather needed
        positions = starts
        rows = np.arange(n)
        input_ids = np.fromiter((r.token_ids[0] for r in reqs), dtype=np.int64, count=n)
    else:
        rows = np.repeat(np.arange(n), query_lens)
        positions = np.arange(num_tokens) - qsl[rows] + starts[rows]
        input_ids = np.fromiter(chain.from_iterable([r.token_ids for r in reqs]), dtype=np.int64, count=num_tokens)
    slot_mapping = block_table[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return HostBatch(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=qsl.astype(np.int32),
        seq_lens=seq_lens.astype(np.int32),
        block_table=block_table,
        num_decodes=int((query_lens == 1).sum()),
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
    )


class PinnedStaging:
    """Host-to-device copies through reused pinned buffers (one per named input), non-blocking.

    ``begin()`` waits until the previous step's copies have left the pinned buffers, ``end()`` marks the
    point after this step's copies. On CPU every call returns the numpy data as a tensor (no copy).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._buffers: dict[str, torch.Tensor] = {}
        self._event = torch.cuda.Event() if self.cuda else None
        self._pending = False

    def begin(self) -> None:
        if self._pending:
            self._event.synchronize()
            self._pending = False

    def end(self) -> None:
        if self.cuda:
            self._event.record()
            self._pending = True

    def pinned(self, name: str, array: np.ndarray) -> torch.Tensor:
        """``array`` copied into the pinned buffer ``name`` (grown as needed); a CPU tensor of its shape."""
        src = torch.from_numpy(np.ascontiguousarray(array))
        if not self.cuda:
            return src
        buf = self._buffers.get(name)
        if buf is None or buf.dtype != src.dtype or buf.numel() < src.numel():
            buf = torch.empty(max(2 * src.numel(), 1024), dtype=src.dtype, pin_memory=True)
            self._buffers[name] = buf
        view = buf[: src.numel()].view(src.shape)
        view.copy_(src)
        return view

    def to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        """A device tensor holding ``array`` (non-blocking copy from the pinned buffer)."""
        host = self.pinned(name, array)
        return host.to(self.device, non_blocking=True) if self.cuda else host


def device_batch(host: HostBatch, staging: PinnedStaging, builder, kv_caches: list, block_size: int) -> "ForwardBatch":
    """A step's ForwardBatch: ``host`` copied to the device through ``staging`` (pinned, non-blocking) and the
    attention ``builder``'s metadata built from it once."""
    from attnserve.attention.backend import CommonAttentionMetadata
    from attnserve.attention.forward_batch import ForwardBatch

    st = staging
    st.begin()
    qsl_cpu = st.pinned("qsl", host.query_start_loc)
    seq_lens_cpu = st.pinned("seq_lens", host.seq_lens)
    table_cpu = st.pinned("block_table", host.block_table)
    dev = st.device
    common = CommonAttentionMetadata(
        query_start_loc=qsl_cpu.to(dev, non_blocking=True),
        query_start_loc_cpu=qsl_cpu,
        seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
        seq_lens_cpu=seq_lens_cpu,
        block_table=table_cpu.to(dev, non_blocking=True),
        slot_mapping=st.to_device("slots", host.slot_mapping),
        num_reqs=host.num_reqs,
        num_actual_tokens=host.num_tokens,
        max_query_len=host.max_query_len,
        max_seq_len=host.max_seq_len,
        num_decodes=host.num_decodes,
        num_decode_tokens=host.num_decodes,
        block_size=block_size,
        block_table_cpu=table_cpu,
    )
    batch = ForwardBatch(
        input_ids=st.to_device("ids", host.input_ids),
        positions=st.to_device("pos", host.positions),
        logits_indices=st.to_device("logits_idx", host.logits_indices),
        attn_metadata=builder.build(common),
        kv_caches=kv_caches,
    )
    st.end()
    return batch
