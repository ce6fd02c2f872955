"""The GGUF config/tokenizer cache: a cached load equals a fresh one exactly; a rewritten file misses; a
cache that cannot be written or read never fails a load.

The default model's GGUF is parsed about four times in all (~3-4 s each): the fresh config and tokenizer,
the shape lookup of the config's completion, and the config of the unwritable-cache test.
"""

from __future__ import annotations

import os

import pytest

from attnserve.model_executor import gguf_cache
from attnserve.model_executor.loader import load_hf_config, load_tokenizer, resolve_model_source

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nnewlines",
    "héllo wörld — ünïcödé ✓ 日本語 🙂",
    "<|im_start|>user\nhi<|im_end|>",
    "",
    "1234567890 3.14159 x**2",
]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hi in Français 🙂"},
    {"role": "assistant", "content": "Salut!"},
    {"role": "user", "content": "Again?"},
]


@pytest.fixture(scope="module")
def loads(tmp_path_factory):
    """(fresh, cached) pairs of the default model's config and tokenizer: the first load fills an empty
    cache (transformers' GGUF conversion), the second reads it (no "unreadable" fallback logged)."""
    import logging

    root = tmp_path_factory.mktemp("attnserve-cache")
    source = resolve_model_source(None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gguf_cache.CACHE_DIR_ENV, str(root))
        fresh = load_hf_config(source), load_tokenizer(source)
        folders = [gguf_cache.part_folder(source.path, part, str(root)) for part in ("config", "tokenizer")]
        assert all(os.path.isdir(f) for f in folders), "the first load did not fill the cache"
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append
        cache_logger = logging.getLogger(gguf_cache.__name__)
        cache_logger.addHandler(handler)
        level = cache_logger.level
        cache_logger.setLevel(logging.DEBUG)
        try:
            cached = load_hf_config(source), load_tokenizer(source)
        finally:
            cache_logger.removeHandler(handler)
            cache_logger.setLevel(level)
    assert [r.getMessage() for r in records] == []  # read from the cache: no fallback to converting
    return source, fresh, cached


def test_cached_config_equals_fresh(loads):
    _, (fresh, _), (cached, _) = loads
    assert type(cached) is type(fresh)
    assert cached.to_dict() == fresh.to_dict()  # _name_or_path and transformers_version included


def test_cached_tokenizer_equals_fresh(loads):
    source, (_, fresh), (_, cached) = loads
    assert type(cached).__name__ == type(fresh).__name__
    assert cached.name_or_path == fresh.name_or_path == source.folder
    assert len(cached) == len(fresh)
    assert cached.get_vocab() == fresh.get_vocab()
    for attr in (
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
        "model_max_length",
        "padding_side",
        "chat_template",
        "all_special_tokens",
        "all_special_ids",
        "special_tokens_map",
    ):
        assert getattr(cached, attr) == getattr(fresh, attr), attr
    assert cached.added_tokens_decoder == fresh.added_tokens_decoder
    for text in TEXTS:
        for special in (True, False):
            ids = fresh.encode(text, add_special_tokens=special)
            assert cached.encode(text, add_special_tokens=special) == ids, text
            assert cached.decode(ids) == fresh.decode(ids)
            assert cached.decode(ids, skip_special_tokens=True) == fresh.decode(ids, skip_special_tokens=True)
    for gen in (True, False):
        text = fresh.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=gen)
        assert cached.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=gen) == text
        assert cached.encode(text, add_special_tokens=False) == fresh.encode(text, add_special_tokens=False)
    assert text.endswith("<|im_end|>\n")  # the last one, without the generation prompt: the template ran


def test_changed_mtime_misses(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    root = str(tmp_path / "cache")
    calls = []

    class Saved:
        def __init__(self, tag):
            self.tag = tag

        def save_pretrained(self, folder):
            with open(os.path.join(folder, "tag"), "w") as f:
                f.write(self.tag)

    def load(folder):
        with open(os.path.join(folder, "tag")) as f:
            return Saved("cached " + f.read())

    def get(tag):
        return gguf_cache.cached_gguf_part(str(gguf), "config", lambda: calls.append(tag) or Saved(tag), load, root)

    assert get("v1").tag == "v1" and calls == ["v1"]
    assert get("never").tag == "cached v1" and calls == ["v1"]  # a hit converts nothing
    st = os.stat(gguf)
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert get("v2").tag == "v2" and calls == ["v1", "v2"]  # the rewritten file misses
    assert get("never").tag == "cached v2"
    # a damaged copy falls back to converting
    folder = gguf_cache.part_folder(str(gguf), "config", root)
    os.remove(os.path.join(folder, "tag"))
    assert get("v3").tag == "v3"


def test_cache_root(tmp_path):
    assert gguf_cache.cache_root({"ATTNSERVE_CACHE_DIR": str(tmp_path)}) == str(tmp_path)
    assert gguf_cache.cache_root({"XDG_CACHE_HOME": "/x"}) == os.path.join("/x", "attnserve")
    assert gguf_cache.cache_root({}) == os.path.join(os.path.expanduser("~"), ".cache", "attnserve")


def test_unwritable_cache_still_loads(tmp_path, monkeypatch, loads, caplog):
    source, (fresh, _), _ = loads
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # the cache root under a regular file: mkdir fails (as root too)
    monkeypatch.setenv(gguf_cache.CACHE_DIR_ENV, str(blocker / "cache"))
    with caplog.at_level("INFO", logger=gguf_cache.__name__):
        config = load_hf_config(source)
    assert config.to_dict() == fresh.to_dict()
    assert "cache not written" in caplog.text


def test_bare_gguf_file_name_loads_from_the_working_directory(tmp_path, monkeypatch, loads):
    """``--model real.gguf`` (no folder in the name) on a cache miss: transformers reads from ``.``."""
    source, (fresh, _), _ = loads
    os.symlink(source.path, tmp_path / "real.gguf")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(gguf_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    bare = resolve_model_source("real.gguf")
    assert bare.folder == os.curdir
    config = load_hf_config(bare)
    drop = {"_name_or_path", "name_or_path"}
    assert {k: v for k, v in config.to_dict().items() if k not in drop} == {
        k: v for k, v in fresh.to_dict().items() if k not in drop
    }


@pytest.mark.parametrize("keep", [1 << 20, 60 << 20])  # cut in the metadata, in the tensor data
def test_truncated_gguf_is_one_error_naming_the_file(tmp_path, monkeypatch, keep):
    with open(resolve_model_source(None).path, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(keep))
    monkeypatch.setenv(gguf_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=f"^GGUF file {tmp_path}/cut.gguf is truncated or damaged: "):
        load_hf_config(resolve_model_source(str(tmp_path / "cut.gguf")))
