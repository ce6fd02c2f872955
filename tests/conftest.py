"""Shared fixtures: the default model loaded once, tiny random-weight models saved as safetensors."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

# the GGUF config/tokenizer cache (model_executor/gguf_cache.py) of this test run: fresh, not the user's
_CACHE_DIR = None if os.environ.get("ATTNSERVE_CACHE_DIR") else tempfile.mkdtemp(prefix="attnserve-test-cache-")
if _CACHE_DIR:
    os.environ["ATTNSERVE_CACHE_DIR"] = _CACHE_DIR


def pytest_sessionfinish(session, exitstatus):
    if _CACHE_DIR:
        import shutil

        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_llm():
    """The default model (SmolLM2-135M-Instruct GGUF) on CPU in float32, with CPU_ATTN."""
    from attnserve import LLM

    return LLM(dtype="float32", device="cpu", attention_backend="CPU_ATTN")


@pytest.fixture(scope="session")
def default_tokenizer():
    """The default model's tokenizer; from the folder ``$ATTNSERVE_TEST_TOKENIZER`` when set (the same tokenizer
    converted to tokenizer.json, e.g. the vLLM kit's, on a machine without the default model's GGUF)."""
    folder = os.environ.get("ATTNSERVE_TEST_TOKENIZER")
    if folder:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    from attnserve.model_executor.loader import load_tokenizer, resolve_model_source

    return load_tokenizer(resolve_model_source(None))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_tokenizer):
    """Factory: architecture name -> folder with a tiny random model (config.json, safetensors, tokenizer)."""
    from tests.models.tiny import make_tiny_model

    made: dict[str, str] = {}

    def make(arch: str) -> str:
        if arch not in made:
            made[arch] = make_tiny_model(arch, tmp_path_factory.mktemp(arch), default_tokenizer)
        return made[arch]

    return make


@pytest.fixture
def worded():
    """The refusal records worded during the test, in order (every :func:`attnserve.refusals.statement` call, which
    each surface's formatter makes its line with): a test of a surface asserts the record its line was made from."""
    import sys

    import attnserve.refusals as refusals

    made: list = []
    original = refusals.statement

    def statement(r, names=None):
        made.append(r)
        return original(r, names)

    def modules():
        return [m for n, m in list(sys.modules.items()) if n.startswith("attnserve") and m is not None]

    for module in modules():  # a module imported during the test takes the wrapper from attnserve.refusals
        if getattr(module, "statement", None) is original:
            module.statement = statement
    yield made
    for module in modules():
        if getattr(module, "statement", None) is statement:
            module.statement = original
