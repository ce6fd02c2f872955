"""Copying one checkpoint tensor into a model parameter, with the checks every model's load_weights makes."""

from __future__ import annotations

import torch

from attnserve.layers.linear import CheckpointShapeError


def copy_weight(params: dict[str, torch.Tensor], name: str, tensor: torch.Tensor, hf_name: str, owner: str) -> None:
    """Copy ``tensor`` into ``params[name]``.

    Raises KeyError naming the checkpoint tensor when no parameter has that name, ValueError on a shape mismatch.
    """
    if name not in params:
        raise KeyError(f"checkpoint tensor {hf_name!r} has no matching parameter in {owner}")
    target = params[name]
    if tuple(target.shape) != tuple(tensor.shape):
        raise CheckpointShapeError(
            f"{hf_name}: checkpoint shape {tuple(tensor.shape)} != expected {tuple(target.shape)}"
        )
    target.data.copy_(tensor[...])  # [...]: a lazy checkpoint slice reads its data here
