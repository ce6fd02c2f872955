"""Layer groups: equal per-layer attention records grouped in order of their first layer, and their names."""

from __future__ import annotations

from attnserve.model_executor.attention_selection import layer_group_name, layer_groups, layer_list
from attnserve.models.dims import LayerAttention


def test_layer_list():
    assert layer_list((0, 1, 2, 3, 5, 7)) == "0-3, 5, 7"
    assert layer_list((1, 3, 5, 7, 9)) == "1, 3, ..., 9"
    assert layer_list((5, 11, 17, 23)) == "5, 11, ..., 23"
    assert layer_list((0, 1, 3, 4)) == "0, 1, 3, 4"
    assert layer_list((4,)) == "4"


def test_gemma3_pattern_groups():
    local, glob = LayerAttention(256, 512), LayerAttention(256)
    kinds = tuple(glob if (i + 1) % 6 == 0 else local for i in range(14))
    assert layer_groups(kinds) == [(local, (0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13)), (glob, (5, 11))]
    assert layer_group_name(1, (5, 11), glob) == "layer group 1 (layers 5, 11: head_size 256)"
    assert layer_group_name(0, (0,), LayerAttention(64, None, 30.0, True)) == (
        "layer group 0 (layer 0: head_size 64, logits_soft_cap 30.0, attention sinks)"
    )
