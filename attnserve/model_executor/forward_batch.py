"""ForwardBatch: everything one model forward pass reads, built once per step by the model runner."""

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
    attn_metadata: Any  # the selected backend's Metadata for this step
    kv_caches: list[torch.Tensor]  # one per layer, the backend's KV-cache shape
