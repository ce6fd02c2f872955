"""benchmarks/shapes: the real models' config.json files load offline and give their published dimensions."""

from __future__ import annotations

import os

import pytest

from attnserve.model_executor.loader import load_hf_config, resolve_model_source
from attnserve.models.registry import get_model_class

SHAPES = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "shapes")


@pytest.mark.parametrize(
    "name,dims,extra",
    [
        (
            "llama-3.1-8b",
            dict(
                num_layers=32,
                num_heads=32,
                num_kv_heads=8,
                head_size=128,
                hidden_size=4096,
                intermediate_size=14336,
                vocab_size=128256,
            ),
            dict(
                tie=False,
                max_pos=131072,
                rope={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                    "rope_theta": 500000.0,
                },
            ),
        ),
        (
            "qwen3-0.6b",
            dict(
                num_layers=28,
                num_heads=16,
                num_kv_heads=8,
                head_size=128,
                hidden_size=1024,
                intermediate_size=3072,
                vocab_size=151936,
            ),
            dict(tie=True, max_pos=40960, rope={"rope_type": "default", "rope_theta": 1000000}),
        ),
    ],
)
def test_shape_config_dimensions(name, dims, extra):
    config = load_hf_config(resolve_model_source(os.path.join(SHAPES, name)))
    got = get_model_class(config).dims(config)
    assert {k: getattr(got, k) for k in dims} == dims
    assert got.sliding_window is None
    assert config.tie_word_embeddings is extra["tie"]
    assert config.max_position_embeddings == extra["max_pos"]
    assert config.rope_parameters == extra["rope"]
