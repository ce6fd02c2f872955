"""The full-size configurations users copy (gpt2, opt-13b, opt-350m, Mistral-7B-v0.1, Meta-Llama-3-8B): our model
accepts every tensor name and shape of transformers' checkpoint for the same config, and its dims are right.

Both models are built on the ``meta`` device, so no memory is allocated and nothing is downloaded.
"""

from __future__ import annotations

import pytest
import torch

from attnserve.models.registry import get_model_class

CONFIGS = {
    "openai-community/gpt2": ("GPT2Config", dict()),
    "facebook/opt-13b": (
        "OPTConfig",
        dict(
            hidden_size=5120,
            ffn_dim=20480,
            num_hidden_layers=40,
            num_attention_heads=40,
            max_position_embeddings=2048,
            vocab_size=50272,
            word_embed_proj_dim=5120,
        ),
    ),
    "facebook/opt-350m": (
        "OPTConfig",
        dict(
            hidden_size=1024,
            ffn_dim=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            vocab_size=50272,
            word_embed_proj_dim=512,
            do_layer_norm_before=False,
        ),
    ),
    "mistralai/Mistral-7B-v0.1": (
        "MistralConfig",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=32000,
            max_position_embeddings=32768,
            sliding_window=4096,
        ),
    ),
    "meta-llama/Meta-Llama-3-8B": (
        "LlamaConfig",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=8192,
            rope_theta=500000.0,
        ),
    ),
}
ARCHITECTURES = {
    "GPT2Config": "GPT2LMHeadModel",
    "OPTConfig": "OPTForCausalLM",
    "MistralConfig": "MistralForCausalLM",
    "LlamaConfig": "LlamaForCausalLM",
}
# (num_layers, num_kv_heads, head_size, sliding_window)
EXPECTED_DIMS = {
    "openai-community/gpt2": (12, 12, 64, None),
    "facebook/opt-13b": (40, 40, 128, None),
    "facebook/opt-350m": (24, 16, 64, None),
    "mistralai/Mistral-7B-v0.1": (32, 8, 128, 4096),
    "meta-llama/Meta-Llama-3-8B": (32, 8, 128, None),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_full_size_checkpoint_names_and_shapes_load(name):
    import transformers
    from transformers import AutoModelForCausalLM

    cls_name, kwargs = CONFIGS[name]
    config = getattr(transformers, cls_name)(**kwargs)
    config.architectures = [ARCHITECTURES[cls_name]]
    model_cls = get_model_class(config)
    dims = model_cls.dims(config)
    assert (dims.num_layers, dims.num_kv_heads, dims.head_size, dims.sliding_window) == EXPECTED_DIMS[name]

    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
        ours = model_cls(config, lambda spec, i: torch.nn.Identity())
    tied = getattr(config, "tie_word_embeddings", False)
    checkpoint = [(k, v) for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")]
    loaded = ours.load_weights(checkpoint)
    assert loaded == ours.expected_weight_names()


def test_gpt2_hub_checkpoint_naming_loads():
    """openai-community/gpt2's model.safetensors: no ``transformer.`` prefix, causal-mask buffers ``h.N.attn.bias``."""
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(n_layer=2)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
        ours = get_model_class(config)(config, lambda spec, i: torch.nn.Identity())
    checkpoint = [(k.removeprefix("transformer."), v) for k, v in hf.state_dict().items() if k != "lm_head.weight"]
    checkpoint += [(f"h.{i}.attn.bias", torch.empty(1, 1, 1024, 1024, device="meta")) for i in range(2)]
    assert ours.load_weights(checkpoint) == ours.expected_weight_names()
