"""One metadata builder over several layer groups: each group's backend builds its own metadata every step.

A model whose layers differ in window, soft cap, head size or sinks (``attention_selection.py``'s layer groups)
gets one builder per group; the runner hands the model a tuple of their metadata (``ForwardBatch.attn_metadata``)
and each ``Attention`` layer reads its group's entry. The CUDA-graph hooks run every group's in turn.
"""

from __future__ import annotations

from typing import Any

from attnserve.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata


class GroupedMetadataBuilder:
    """The :class:`AttentionMetadataBuilder` interface over ``builders`` (one per layer group, in group order);
    metadata is a tuple with one entry per group."""

    def __init__(self, builders: list[AttentionMetadataBuilder]) -> None:
        self.builders = builders

    def build(self, common: CommonAttentionMetadata) -> tuple[Any, ...]:
        return tuple(b.build(common) for b in self.builders)

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> tuple[Any, ...]:
        return tuple(b.build_for_cudagraph_capture(common) for b in self.builders)

    @property
    def supports_cascade(self) -> bool:
        return False  # one shared prefix per step is not yet planned per layer group

    def cudagraph_prologue(self, metadata: tuple[Any, ...]) -> None:
        for b, m in zip(self.builders, metadata):
            b.cudagraph_prologue(m)

    def prepare_cudagraph_replay(self, metadata: tuple[Any, ...], common: CommonAttentionMetadata) -> None:
        for b, m in zip(self.builders, metadata):
            b.prepare_cudagraph_replay(m, common)
