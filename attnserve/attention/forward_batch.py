"""ForwardBatch: everything one model forward pass reads, built once per step by the model runner.

It lives with attention because the Attention layer reads its KV caches and metadata, and the models
(which import attention, never the runner) take it as their forward argument; the runner builds it
(``model_executor/forward_batch.py``: the host arrays and their staging to the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ForwardBatch:
    """The model's inputs for one step. Requests are ordered decodes first, then prefills."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64, position of each token in its sequence
    logits_indices: torch.Tensor  # (B,) int64, index in T of each request's last token
    attn_metadata: Any  # the selected backend's Metadata for this step; a tuple of each layer group's, if several
    kv_caches: list[torch.Tensor]  # one per layer, the backend's KV-cache shape
