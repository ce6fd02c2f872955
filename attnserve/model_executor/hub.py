"""Models named by Hugging Face Hub id (``org/name``): download into the hub cache, or find them there offline.

Everything goes through ``huggingface_hub.snapshot_download``, so the cache is the one other tools share
(``--download-dir``, else ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), the
token is ``HF_TOKEN`` (or ``hf auth login``'s), and ``HF_HUB_OFFLINE=1`` means cache only. Only the files
the engine reads are fetched, in two steps:

1. config and tokenizer files, and the safetensors index (small; enough for ``load_format="dummy"``);
2. the weights: the shards the index names, else the top-level ``*.safetensors``. PyTorch ``.bin`` / ``.pth``
   files and subfolders (``original/`` of Llama 3) are never fetched.

Every failure (gated or missing repo, unknown revision, no network, not cached offline) becomes one
ModelNotFoundError line saying what happened and what to do.
"""

from __future__ import annotations

import json
import logging
import os

from attnserve.model_executor.loader import ModelNotFoundError
from attnserve.refusals import models as words

logger = logging.getLogger(__name__)

CONFIG_FILES = ["config.json", "generation_config.json"]
TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "spiece.model",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
]
SAFETENSORS_INDEX = "model.safetensors.index.json"
_TOP_LEVEL_ONLY = ["*/*"]  # fnmatch's * crosses "/": this keeps subfolders (original/, onnx/, ...) out
_TRUE = ("1", "ON", "YES", "TRUE")


def is_hub_id(model: str) -> bool:
    """Whether ``model`` (not an existing local path) reads as a hub id: ``org/name`` or ``name``.

    Strings that look like paths (``/x``, ``./x``, ``~/x``, ``a/b/c``, ``x.gguf``) are not hub ids, so that a
    mistyped local path gets the local "not found" message.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if model.startswith(("/", ".", "~")) or "\\" in model or model.count("/") > 1 or model.endswith(".gguf"):
        return False
    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as set now; huggingface_hub reads it once, at import."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return env.upper() in _TRUE if env is not None else constants.HF_HUB_OFFLINE


def download_model(
    repo_id: str, revision: str | None = None, cache_dir: str | None = None, weights: bool = True
) -> str:
    """Snapshot folder of ``repo_id`` at ``revision`` with its config, tokenizer and (``weights``) safetensors.

    Downloads what is missing (with huggingface_hub's progress bars); offline, only looks in the cache.
    Raises ModelNotFoundError with one line saying what happened and what to do.
    """
    where = _describe(repo_id, revision)
    folder = _snapshot(repo_id, revision, cache_dir, CONFIG_FILES + TOKENIZER_FILES + [SAFETENSORS_INDEX])
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ModelNotFoundError(words.hub_without_config(where))
    if weights:
        commit = os.path.basename(folder)  # snapshots/<commit>: pinning it skips a second revision look-up
        shards = _index_shards(folder)
        _snapshot(repo_id, commit, cache_dir, shards or ["*.safetensors"], ignore=None if shards else _TOP_LEVEL_ONLY)
        _check_weights(folder, shards, where)
    logger.info("%s -> %s", where, folder)
    return folder


def download_tokenizer(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> str:
    """Snapshot folder of ``repo_id`` with its config and tokenizer files (for ``--tokenizer``); no weights."""
    return _snapshot(repo_id, revision, cache_dir, CONFIG_FILES + TOKENIZER_FILES)


def _describe(repo_id: str, revision: str | None) -> str:
    return words.hub_model(repo_id, revision)


def _index_shards(folder: str) -> list[str]:
    index = os.path.join(folder, SAFETENSORS_INDEX)
    if not os.path.isfile(index):
        return []
    with open(index) as f:
        return sorted(set(json.load(f)["weight_map"].values()))


def _check_weights(folder: str, shards: list[str], where: str) -> None:
    present = {f for f in os.listdir(folder) if f.endswith(".safetensors")}
    missing = [s for s in shards if s not in present]
    if present and not missing:
        return
    if hub_offline():
        raise ModelNotFoundError(words.cached_snapshot_lacks(where, folder, missing))
    raise ModelNotFoundError(words.hub_without_safetensors(where))


def _snapshot(
    repo_id: str, revision: str | None, cache_dir: str | None, allow: list[str], ignore: list[str] | None = None
) -> str:
    """``snapshot_download`` with huggingface_hub's exceptions turned into one-line ModelNotFoundErrors."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hub_offline()
    where = _describe(repo_id, revision)
    try:
        return snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            allow_patterns=allow,
            ignore_patterns=ignore,
            local_files_only=offline,
        )
    except GatedRepoError:
        raise ModelNotFoundError(words.hub_gated(where, repo_id)) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(words.hub_no_revision(repo_id, revision)) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(words.hub_no_repo(repo_id)) from None
    except LocalEntryNotFoundError as e:  # not in the cache, and the hub was not asked or did not answer
        cache = cache_dir or _default_cache()
        if offline:
            raise ModelNotFoundError(words.hub_offline_not_cached(where, cache, repo_id)) from None
        cause = e.__cause__
        answered = isinstance(cause, HfHubHTTPError) and cause.response is not None
        raise ModelNotFoundError(
            words.hub_unreachable(
                where,
                cache,
                repo_id,
                cause.response.status_code if answered else None,  # type: ignore[union-attr]
                _endpoint(),
                _first_line(cause or e),
            )
        ) from None


def _default_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
