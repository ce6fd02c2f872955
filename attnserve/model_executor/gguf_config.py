"""The parts of a GGUF model's config that transformers' conversion of the metadata leaves at the config class's
defaults, filled from the metadata and tensors as llama.cpp reads them (``src/llama-model.cpp``).

Every architecture: ``vocab_size`` from ``token_embd``'s rows; ``head_dim`` from ``{arch}.attention.key_length``;
``sliding_window`` from ``{arch}.attention.sliding_window``. The Llama-like ones (``gguf_arch.FLAGGED_BIAS_ARCHS``):
``attention_bias`` / ``mlp_bias`` True where the file has ``attn_{q,k,v,output}`` / ``ffn_{gate,up,down}`` biases
(llama.cpp loads each bias it finds), where the config class has that flag; any other bias tensor is refused naming
it. Then per ``general.architecture``:

* ``gpt2``: ``n_positions`` from ``gpt2.context_length`` (transformers maps it to ``n_ctx``, which GPT2Config no
  longer reads).
* ``llama`` with ``llama.expert_count`` > 0: a Mixtral (``MixtralForCausalLM``; its experts and top-k).
* ``qwen3moe``: ``moe_intermediate_size`` from ``expert_feed_forward_length``; every layer sparse (gguf maps no
  dense FFN for it); top-k weights renormalized (llama.cpp's Qwen3-MoE always does; ``expert_weights_norm``
  when the file says).
* ``gemma2``: both soft caps from the metadata (transformers keeps Gemma2Config's 50 / 30).
* ``gemma3``: one global layer in ``sliding_window_pattern`` (6, llama.cpp's, unless the file says), RoPE base
  10,000 on local layers and ``rope.freq_base`` (with ``rope.scaling`` linear) on global ones; final soft cap.
* ``gemma2`` / ``gemma3``: ``query_pre_attn_scalar`` as llama.cpp derives it (GGUF stores none): ``hidden_size /
  num_attention_heads`` for the 27B models (46 / 62 layers), the head size otherwise.
* ``gpt-oss``: ``swiglu_limit`` from ``swiglu_clamp_exp`` when present (else 7.0, llama.cpp's); YaRN without
  truncation (the published configs' ``truncate: false``; GGUF stores no such key).
"""

from __future__ import annotations

import re

from attnserve.model_executor.gguf_arch import BIAS_FLAGS, FLAGGED_BIAS_ARCHS
from attnserve.model_executor.weights import gguf_architecture, gguf_metadata, gguf_reader, gguf_tensor_shape
from attnserve.refusals import Refused
from attnserve.refusals import models as words

_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def complete_gguf_config(config, path: str) -> None:
    """Fill, in place, what transformers' GGUF metadata mapping of ``path`` leaves at the class defaults.

    Raises Refused (``general.architecture``) for an architecture without a tensor mapping."""
    arch = gguf_architecture(path)

    def meta(key: str, default=None):
        value = gguf_metadata(path, key.format(arch=arch))
        return default if value is None else value

    rows = gguf_tensor_shape(path, "token_embd.weight")
    if rows is not None:
        config.vocab_size = rows[0]
    if meta("{arch}.attention.key_length") is not None and hasattr(config, "head_dim"):
        config.head_dim = int(meta("{arch}.attention.key_length"))
    if meta("{arch}.attention.sliding_window") is not None:
        config.sliding_window = int(meta("{arch}.attention.sliding_window"))
    if arch in FLAGGED_BIAS_ARCHS:
        _complete_biases(config, arch, path)

    if arch == "gpt2" and getattr(config, "n_ctx", None):
        config.n_positions = config.n_ctx
    elif arch == "llama" and meta("llama.expert_count", 0) > 0:
        config.architectures = ["MixtralForCausalLM"]
        config.num_local_experts = int(meta("llama.expert_count"))
        config.num_experts_per_tok = int(meta("llama.expert_used_count"))
        config.sliding_window = None
    elif arch == "qwen3moe":
        shape = gguf_tensor_shape(path, "blk.0.ffn_gate_exps.weight")  # (E, I, H)
        config.moe_intermediate_size = int(meta("{arch}.expert_feed_forward_length", shape[1] if shape else 0))
        config.norm_topk_prob = bool(meta("{arch}.expert_weights_norm", True))
        config.mlp_only_layers, config.decoder_sparse_step = [], 1
    elif arch in ("gemma2", "gemma3"):
        _complete_gemma(config, arch, meta)
    elif arch == "gpt-oss":
        limit = meta("{arch}.swiglu_clamp_exp")
        if limit is not None:
            config.swiglu_limit = float(limit[0] if isinstance(limit, list) else limit)
        scaling = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
        if isinstance(scaling, dict) and scaling.get("rope_type") == "yarn":
            scaling["truncate"] = False


def _complete_biases(config, arch: str, path: str) -> None:
    """Set the config's bias flags from the layer bias tensors in ``path`` (transformers' metadata conversion sets
    none); Refused naming the first bias tensor that no flag of this config class switches on."""
    first: dict[str, str] = {}  # short name -> the first full tensor name with it
    for tensor in gguf_reader(path).tensors:
        m = re.fullmatch(r"blk\.\d+\.(\w+)\.bias", tensor.name)
        if m and m[1] not in FLAGGED_BIAS_ARCHS[arch]:
            first.setdefault(m[1], tensor.name)
    for short, name in first.items():
        flag = next((f for f, shorts in BIAS_FLAGS.items() if short in shorts), None)
        if flag is None or not hasattr(config, flag):
            raise Refused(words.gguf_bias_unsupported(name, path, arch, type(config).__name__))
        setattr(config, flag, True)


def _complete_gemma(config, arch: str, meta) -> None:
    if config.num_hidden_layers == _GEMMA_27B_LAYERS[arch]:
        config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads
    else:
        config.query_pre_attn_scalar = config.head_dim
    # absent: the config class's (Gemma 2: 50 and 30, llama.cpp's defaults too; Gemma 3: none)
    config.final_logit_softcapping = meta("{arch}.final_logit_softcapping", config.final_logit_softcapping)
    if arch == "gemma2":
        config.attn_logit_softcapping = meta("{arch}.attn_logit_softcapping", config.attn_logit_softcapping)
        return
    pattern = int(meta("{arch}.attention.sliding_window_pattern", 6))
    config.sliding_window_pattern = pattern
    config.layer_types = [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(config.num_hidden_layers)
    ]
    full = {"rope_type": "default", "rope_theta": float(meta("{arch}.rope.freq_base", 1_000_000.0))}
    if meta("{arch}.rope.scaling.type") == "linear":
        full = {**full, "rope_type": "linear", "factor": float(meta("{arch}.rope.scaling.factor"))}
    config.rope_parameters = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": full,
    }


def gguf_config_of_own(path: str):
    """A transformers config built here from ``path``'s metadata, for the architectures whose conversion in
    transformers fails (gpt-oss: it reads each ``rope.scaling.*`` value from the field's first part, the key's
    length, so any gpt-oss GGUF with YaRN raises TypeError); None for the others (transformers converts them).
    :func:`complete_gguf_config` still runs on it."""
    if gguf_architecture(path) != "gpt-oss":
        return None
    from transformers import GptOssConfig

    def meta(key: str, default=None):
        value = gguf_metadata(path, f"gpt-oss.{key}")
        return default if value is None else value

    heads = int(meta("attention.head_count"))
    rope = {"rope_type": "default", "rope_theta": float(meta("rope.freq_base", 150000.0))}
    if meta("rope.scaling.type") == "yarn":
        rope.update(
            rope_type="yarn",
            factor=float(meta("rope.scaling.factor")),
            original_max_position_embeddings=int(meta("rope.scaling.original_context_length")),
            beta_fast=float(meta("rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(meta("rope.scaling.yarn_beta_slow", 1.0)),
            truncate=False,
        )
    rows = gguf_tensor_shape(path, "token_embd.weight")
    return GptOssConfig(
        num_hidden_layers=int(meta("block_count")),
        hidden_size=int(meta("embedding_length")),
        intermediate_size=int(meta("expert_feed_forward_length", meta("feed_forward_length"))),
        num_attention_heads=heads,
        num_key_value_heads=int(meta("attention.head_count_kv", heads)),
        head_dim=int(meta("attention.key_length", 64)),
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(meta("context_length")),
        sliding_window=int(meta("attention.sliding_window", 128)),
        num_local_experts=int(meta("expert_count")),
        num_experts_per_tok=int(meta("expert_used_count")),
        vocab_size=rows[0] if rows else 201088,
        rope_parameters=rope,
        tie_word_embeddings=gguf_tensor_shape(path, "output.weight") is None,
        bos_token_id=gguf_metadata(path, "tokenizer.ggml.bos_token_id"),
        eos_token_id=gguf_metadata(path, "tokenizer.ggml.eos_token_id"),
    )
