"""One server with the default model for the whole package (loading it takes ~20 s on CPU)."""

from __future__ import annotations

import pytest

from tests.entrypoints.openai.utils import RemoteServer

MAX_MODEL_LEN = 256  # small, so that "prompt longer than the context" is cheap to send
SERVER_ARGS = ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "64", "--log-level", "warning"]


@pytest.fixture(scope="package")
def server():
    srv = RemoteServer(SERVER_ARGS)
    yield srv
    srv.stop()


@pytest.fixture(scope="package")
def client(server):
    return server.openai()


@pytest.fixture(scope="package")
def model_name(client) -> str:
    return client.models.list().data[0].id
