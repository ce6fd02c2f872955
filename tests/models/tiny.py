"""Tiny random-weight checkpoints of each supported architecture, built from transformers configs."""

from __future__ import annotations

from tests.helpers import save_tiny_model

_COMMON = dict(
    vocab_size=49152,  # the default model's tokenizer is saved beside the weights
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)


SLIDING_WINDOW = 8  # tiny, so that test prompts and generations run past it


def tiny_config(arch: str, hidden: int = 64):
    """A transformers config of architecture ``arch`` with tiny dimensions: 4 query heads of ``hidden / 4``
    (16 on CPU; the GPU tests use 256, since some GPU backends support only head sizes 64, 128, 256)."""
    from transformers import (
        GPT2Config,
        GptOssConfig,
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        OPTConfig,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    COMMON = {**_COMMON, "hidden_size": hidden, "intermediate_size": 2 * hidden}
    if arch == "llama":
        return LlamaConfig(**COMMON, rope_theta=10000.0)
    if arch == "llama3":  # Llama 3.1 RoPE scaling, tied embeddings
        return LlamaConfig(
            **{**COMMON, "tie_word_embeddings": True},
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    if arch == "mistral":
        return MistralConfig(**COMMON, sliding_window=None)
    if arch == "mistral_sw":  # Mistral v0.1's sliding window (4096 there)
        return MistralConfig(**COMMON, sliding_window=SLIDING_WINDOW)
    if arch == "gpt2":  # tied LM head, GELU (tanh), n_inner None = 4 * n_embd
        return GPT2Config(vocab_size=49152, n_embd=hidden, n_layer=2, n_head=4, n_positions=512)
    if arch.startswith("opt"):
        opt = dict(
            vocab_size=49152,
            hidden_size=hidden,
            ffn_dim=2 * hidden,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
            word_embed_proj_dim=hidden,
        )
        if arch == "opt":  # pre-LayerNorm (opt-125m and larger)
            return OPTConfig(**opt, do_layer_norm_before=True)
        if arch == "opt_post_ln":  # post-LayerNorm with half-wide embeddings projected in and out (opt-350m)
            return OPTConfig(**{**opt, "word_embed_proj_dim": hidden // 2}, do_layer_norm_before=False)
    if arch == "gemma2":  # both soft caps, a window on even layers, query_pre_attn_scalar != head size
        from transformers import Gemma2Config

        return Gemma2Config(
            **{**COMMON, "num_hidden_layers": 4, "tie_word_embeddings": True},
            head_dim=hidden // 2,
            sliding_window=SLIDING_WINDOW,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=30.0,
        )
    if arch == "gemma3":  # 2 local : 1 global (sliding_window_pattern 3), global RoPE linear-scaled, q/k norms
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 6, "tie_word_embeddings": True},
            head_dim=hidden // 2,
            sliding_window=SLIDING_WINDOW,
            query_pre_attn_scalar=24,
            sliding_window_pattern=3,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            },
        )
    if arch == "qwen2":
        return Qwen2Config(**COMMON)
    if arch == "qwen3":
        return Qwen3Config(**COMMON, head_dim=hidden // 2)
    # the window on layer 1 only: transformers' layer_types slide the layers from max_window_layers on
    if arch == "qwen2_sw":
        return Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=SLIDING_WINDOW, max_window_layers=1)
    if arch == "qwen3_sw":
        return Qwen3Config(
            **COMMON, head_dim=hidden // 2, use_sliding_window=True, sliding_window=SLIDING_WINDOW, max_window_layers=1
        )
    if arch == "qwen3_moe":  # 8 experts, top 2 renormalized; layer 1 sparse, layer 0 dense (mlp_only_layers)
        return Qwen3MoeConfig(
            **{**COMMON, "num_hidden_layers": 3},
            head_dim=hidden // 2,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=hidden // 2,
            norm_topk_prob=True,
            mlp_only_layers=[0],
        )
    if arch == "qwen3_moe_step2":  # every second layer sparse, top-k weights not renormalized
        return Qwen3MoeConfig(
            **{**COMMON, "num_hidden_layers": 4},
            head_dim=hidden // 2,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=hidden // 2,
            norm_topk_prob=False,
            decoder_sparse_step=2,
        )
    if arch == "mixtral":  # no sliding window (Mixtral 8x7B's config says null)
        return MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    if arch == "mixtral_sw":
        return MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=SLIDING_WINDOW)
    if arch.startswith("gpt_oss"):  # sinks, biases, YaRN, 8 experts top 4 with the clamped SwiGLU
        # gpt_oss_mixed: layer_types None, transformers' default: windowed and full layers alternating
        kind = {"gpt_oss": "full_attention", "gpt_oss_sw": "sliding_attention"}.get(arch)
        return GptOssConfig(
            **{**COMMON, "intermediate_size": hidden},
            head_dim=hidden // 4,
            num_local_experts=8,
            num_experts_per_tok=4,
            sliding_window=SLIDING_WINDOW,
            swiglu_limit=0.5,
            layer_types=None if kind is None else [kind] * COMMON["num_hidden_layers"],
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 64,
                "truncate": False,
            },
        )
    raise ValueError(arch)


ARCHITECTURES = {
    "GPT2Config": "GPT2LMHeadModel",
    "OPTConfig": "OPTForCausalLM",
    "Gemma3TextConfig": "Gemma3ForCausalLM",
}
# Gemma's norms store the offset from 1 (initialized to 0): random ones, so that the (1 + w) is tested
RANDOM_NORMS = {"gemma2", "gemma3"}


def make_tiny_model(arch: str, path, tokenizer, hidden: int = 64, **changes) -> str:
    """Save a tiny random model of ``arch`` (config attributes ``changes`` set first) with ``tokenizer`` to
    ``path``; returns the folder."""
    config = tiny_config(arch, hidden)
    for key, value in changes.items():
        setattr(config, key, value)
    config.architectures = [
        ARCHITECTURES.get(type(config).__name__, type(config).__name__.replace("Config", "ForCausalLM"))
    ]
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id
    save_tiny_model(config, path, norm_std=0.3 if arch in RANDOM_NORMS else None)
    tokenizer.save_pretrained(path)
    return str(path)


def write_gpt2_gguf(model_dir: str, out_path: str) -> str:
    """Convert a GPT-2 safetensors folder to an F32 GGUF in llama.cpp's layout (``convert_hf_to_gguf.py``'s
    GPT2Model: metadata keys, tensor names from gguf's own name map, Conv1D weights transposed to (out, in),
    causal-mask buffers dropped). No tokenizer is written: tests pass the folder's tokenizer."""
    import gguf
    import numpy as np
    from transformers import AutoConfig

    from attnserve.model_executor.weights import safetensors_weights

    config = AutoConfig.from_pretrained(model_dir)
    writer = gguf.GGUFWriter(out_path, "gpt2")
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, config.n_layer)
    for name, tensor in safetensors_weights(model_dir):
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            tensor = tensor.t()
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new_name is not None, name
        writer.add_tensor(new_name, np.ascontiguousarray(tensor.float().numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
