"""Copying one checkpoint tensor into a model parameter, with the checks every model's load_weights makes."""

from __future__ import annotations

import torch

from attnserve.layers.linear import CheckpointShapeError
from attnserve.refusals import models as words


def copy_weight(params: dict[str, torch.Tensor], name: str, tensor: torch.Tensor, hf_name: str, owner: str) -> None:
    """Copy ``tensor`` into ``params[name]``.

    Raises KeyError naming the checkpoint tensor when no parameter has that name, ValueError on a shape mismatch.
    """
    if name not in params:
        raise KeyError(words.no_parameter(hf_name, owner))
    target = params[name]
    if tuple(target.shape) != tuple(tensor.shape):
        raise CheckpointShapeError(tuple(tensor.shape), tuple(target.shape), hf_name)
    target.data.copy_(tensor[...])  # [...]: a lazy checkpoint slice reads its data here


def in_tensor(error: ValueError, hf_name: str) -> ValueError:
    """A weight loader's refusal placed at checkpoint tensor ``hf_name``; a shape mismatch stays a
    CheckpointShapeError (the engine reads the type)."""
    if isinstance(error, CheckpointShapeError):
        return error.of(hf_name)
    return ValueError(words.in_tensor(hf_name, error))
