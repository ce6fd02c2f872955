"""Async scheduling's placeholder tokens: a step's input ids that are the step before's samples, still on the
device when the step is planned (``core/step.PLACEHOLDER_TOKEN``), written into the step's device input ids
before its forward pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnserve.core.step import PLACEHOLDER_TOKEN
from attnserve.model_executor.sampling_batch import LastSample

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.core.step import SchedulerOutput
    from attnserve.distributed.group import TPGroup
    from attnserve.model_executor.forward_batch import HostBatch, PinnedStaging
    from attnserve.model_executor.sampling_batch import SamplingState


def placeholder_fill(
    sched: "SchedulerOutput", host: "HostBatch", sampling: "SamplingState", tp: "TPGroup", staging: "PinnedStaging"
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """For a step with placeholder token ids: a function that writes the last step's sampled tokens
    (``sampling.last_sample``) into the step's device ``input_ids`` (T,) at those positions; None when there
    are none. Under tensor parallelism only rank 0 sampled: its tokens reach the other ranks here, when a step
    first needs them (one small collective, queued before the step's forward pass; none without placeholders),
    and become every rank's ``last_sample``."""
    dst = np.flatnonzero(host.input_ids == PLACEHOLDER_TOKEN)
    if not len(dst):
        return None
    last_tokens, last_rows = sampling.last_sample.token_ids, sampling.last_sample.rows
    if tp.size > 1:
        last_tokens = tp.broadcast(
            last_tokens.contiguous()
            if tp.is_driver
            else torch.empty(len(last_rows), dtype=torch.int64, device=staging.device)
        )
        sampling.last_sample = LastSample(last_tokens, last_rows)
    req_index = np.searchsorted(host.query_start_loc, dst, side="right") - 1
    reqs = sched.requests
    src = np.fromiter((last_rows[reqs[i].request_id] for i in req_index), dtype=np.int64, count=len(dst))
    n = len(dst)
    if dst[-1] == n - 1 and src[-1] == n - 1 and (dst == src).all():  # rows 0..n-1 in the last step's order
        return lambda input_ids: input_ids[:n].copy_(last_tokens[:n])
    dst_t = staging.to_device("fill_dst", dst)
    src_t = staging.to_device("fill_src", src)
    return lambda input_ids: input_ids.index_copy_(0, dst_t, last_tokens.index_select(0, src_t))
