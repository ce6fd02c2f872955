"""Hub model ids without network: a hub cache built as huggingface_hub lays it out, the one-line errors
(offline and not cached, no network, gated, missing repo, unknown revision), which files a download fetches,
and ``load_format="dummy"`` from a bare config.json."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import threading
import time

import pytest

from attnserve import LLM, SamplingParams
from attnserve.entrypoints.cli.main import main
from attnserve.model_executor import hub
from attnserve.model_executor.loader import ModelNotFoundError, ModelSource, resolve_model_source
from tests.model_executor.hub_cache import add_to_hub_cache

CPU = dict(dtype="float32", device="cpu", attention_backend="CPU_ATTN")
PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7]]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def online(monkeypatch):
    """Network mode as far as huggingface_hub knows (the tests still point it at local endpoints only)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tiny_model_dir):
    """A hub cache holding ``org/tiny-llama`` (symlinks into blobs/, refs/main) and ``org/tiny-llama-copies``
    (plain files in the snapshot, no blobs), both from the tiny llama folder."""
    cache = str(tmp_path_factory.mktemp("hub"))
    folder = tiny_model_dir("llama")
    commit = add_to_hub_cache(folder, cache, "org/tiny-llama")
    add_to_hub_cache(folder, cache, "org/tiny-llama-copies", symlinks=False)
    return cache, folder, commit


def _token_ids(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def folder_llm(tiny_model_dir):
    """The tiny llama loaded from its folder: the reference for the hub-loaded copies."""
    return LLM(tiny_model_dir("llama"), **CPU)


def test_layout_is_the_one_huggingface_hub_accepts(hub_cache):
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    cache, _, commit = hub_cache
    snap = snapshot_download("org/tiny-llama", cache_dir=cache, local_files_only=True)
    assert snap == os.path.join(cache, "models--org--tiny-llama", "snapshots", commit)
    assert try_to_load_from_cache("org/tiny-llama", "config.json", cache_dir=cache) == os.path.join(snap, "config.json")


@pytest.mark.parametrize("repo", ["org/tiny-llama", "org/tiny-llama-copies"])
def test_cached_hub_id_resolves_offline_and_generates_as_the_folder(hub_cache, folder_llm, offline, repo):
    cache, _, _ = hub_cache
    source = resolve_model_source(repo, download_dir=cache)
    assert source.repo_id == repo and source.path.startswith(os.path.join(cache, f"models--{repo.replace('/', '--')}"))
    from_hub = LLM(repo, download_dir=cache, **CPU)
    assert from_hub.tokenizer.encode("hello world") == folder_llm.tokenizer.encode("hello world")
    assert _token_ids(from_hub) == _token_ids(folder_llm)


def test_revision_picks_the_snapshot(hub_cache, folder_llm, offline, tmp_path):
    cache, folder, commit = hub_cache
    cache2 = str(tmp_path / "cache")
    shutil.copytree(cache, cache2, symlinks=True)
    other = str(tmp_path / "no-tokenizer")  # a second commit of the same repo, tagged v2, without tokenizer files
    os.makedirs(other)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(os.path.join(folder, name), os.path.join(other, name))
    commit2 = add_to_hub_cache(other, cache2, "org/tiny-llama", ref="v2")
    assert resolve_model_source("org/tiny-llama", download_dir=cache2).path.endswith(commit)
    assert resolve_model_source("org/tiny-llama", revision="v2", download_dir=cache2).path.endswith(commit2)
    assert resolve_model_source("org/tiny-llama", revision=commit, download_dir=cache2).path.endswith(commit)
    with pytest.raises(ModelNotFoundError, match="pass --tokenizer"):  # real weights need a real tokenizer
        LLM("org/tiny-llama", revision="v2", download_dir=cache2, **CPU)
    # --tokenizer naming the same repo takes --revision too: v2 has no tokenizer, so it is not found there
    with pytest.raises(
        ModelNotFoundError, match=r"^tokenizer 'org/tiny-llama' \(revision 'v2'\) has no tokenizer files"
    ):
        LLM("org/tiny-llama", revision="v2", tokenizer="org/tiny-llama", download_dir=cache2, **CPU)
    llm = LLM("org/tiny-llama", revision="v2", tokenizer=folder, download_dir=cache2, **CPU)
    assert _token_ids(llm) == _token_ids(folder_llm)
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model_source("org/tiny-llama", revision="v3", download_dir=cache2)
    assert str(e.value).startswith("hub model 'org/tiny-llama' (revision 'v3') is not in the Hugging Face cache")


def test_offline_id_not_cached_is_one_line(offline, tmp_path, capsys):
    rc = main(["generate", "--model", "org/not-cached", "--download-dir", str(tmp_path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err == (
        f"attnserve generate: error: hub model 'org/not-cached' is not in the Hugging Face cache {tmp_path} and "
        "HF_HUB_OFFLINE is set: download it with network access (hf download org/not-cached), point "
        "--download-dir or HF_HUB_CACHE at a cache that holds it, or pass a local folder\n"
    )


def test_cached_snapshot_without_weights_offline(hub_cache, offline, tmp_path):
    cache, folder, _ = hub_cache
    add_to_hub_cache(
        folder, str(tmp_path), "org/config-only", files=["config.json", "tokenizer.json", "tokenizer_config.json"]
    )
    with pytest.raises(ModelNotFoundError, match="lacks safetensors weights and HF_HUB_OFFLINE is set"):
        resolve_model_source("org/config-only", download_dir=str(tmp_path))
    assert (
        resolve_model_source("org/config-only", download_dir=str(tmp_path), weights=False).repo_id == "org/config-only"
    )


def test_hub_cache_from_environment(hub_cache, tmp_path):
    """HF_HUB_CACHE and HF_HUB_OFFLINE as a user sets them, read by huggingface_hub in a fresh process."""
    import subprocess
    import sys

    cache, _, _ = hub_cache
    out = tmp_path / "out.json"
    env = {**os.environ, "HF_HUB_CACHE": cache, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnserve",
            "generate",
            "--model",
            "org/tiny-llama",
            "--prompt",
            "hi",
            "--max-tokens",
            "3",
            "--ignore-eos",
            "--device",
            "cpu",
            "--output-json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(out.read_text())["requests"][0]["outputs"][0]["token_ids"]) == 3


@pytest.mark.parametrize(
    "model, is_id",
    [
        ("org/name", True),
        ("gpt2", True),
        ("meta-llama/Meta-Llama-3-8B", True),
        ("/no/such/dir", False),
        ("./org/name", False),
        ("~/models/x", False),
        ("a/b/c", False),
        ("model.gguf", False),
        ("org/na me", False),
    ],
)
def test_what_reads_as_a_hub_id(model, is_id):
    assert hub.is_hub_id(model) is is_id


def test_existing_local_path_wins_over_hub_id(tiny_model_dir, monkeypatch, offline):
    folder = tiny_model_dir("llama")
    parent, name = os.path.split(folder)
    monkeypatch.chdir(os.path.dirname(parent))
    rel = os.path.join(os.path.basename(parent), name)  # "pytest-N/llama0": also a valid hub id
    assert hub.is_hub_id(rel)
    assert resolve_model_source(rel) == ModelSource(rel, is_gguf=False)


# --- errors from the network side: a closed port, and a local fake of the hub's API -----------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_network_is_one_line_and_quick(online, monkeypatch, tmp_path):
    from huggingface_hub import constants

    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", url)
    t0 = time.monotonic()
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model_source("org/name", download_dir=str(tmp_path))
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"hub model 'org/name': cannot reach the Hugging Face Hub ({url}: ")
    assert msg.endswith(
        f"and it is not in the cache {tmp_path}: check the network (or HF_ENDPOINT, a proxy), "
        "pre-download it where there is network (hf download org/name) and copy the cache, "
        "or pass a local folder"
    )


class _FakeHub(http.server.BaseHTTPRequestHandler):
    """Answers the hub API's model-info route with the errors huggingface_hub maps by X-Error-Code."""

    ERRORS = {
        "org/gated": (403, "GatedRepo"),
        "org/missing": (401, "RepoNotFound"),
        "org/name": (404, "RevisionNotFound"),
        "org/down": (500, None),
    }

    def do_GET(self):  # noqa: N802
        repo = "/".join(self.path.split("/")[3:5])  # /api/models/<org>/<name>/revision/<rev>
        status, code = self.ERRORS.get(repo, (404, "RepoNotFound"))
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"error": code or "Internal Error"}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_hub(online, monkeypatch):
    from huggingface_hub import constants

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    yield
    server.shutdown()


@pytest.mark.parametrize(
    "repo, revision, message",
    [
        (
            "org/gated",
            None,
            "hub model 'org/gated' is gated on the Hugging Face Hub: accept its terms at "
            "https://huggingface.co/org/gated, then log in (hf auth login) or set HF_TOKEN to a token of that account",
        ),
        (
            "org/missing",
            None,
            "model 'org/missing' is not a local path, and the Hugging Face Hub has no repo 'org/missing' this "
            "token can see: check the name, or for a private repo log in (hf auth login) or set HF_TOKEN",
        ),
        (
            "org/name",
            "no-such-branch",
            "revision 'no-such-branch' does not exist in hub model 'org/name': give one of its "
            "branches, tags or commit hashes with --revision, or leave it out for the default branch",
        ),
    ],
)
def test_hub_errors_are_one_line(fake_hub, tmp_path, repo, revision, message):
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model_source(repo, revision=revision, download_dir=str(tmp_path))
    assert str(e.value) == message


def test_hub_server_error(fake_hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 2, raising=False)
    with pytest.raises(ModelNotFoundError, match=r"^hub model 'org/down': the Hugging Face Hub answered HTTP 500, "):
        resolve_model_source("org/down", download_dir=str(tmp_path))


# --- which files a download fetches ----------------------------------------------------------------------

LLAMA3_FILES = [  # meta-llama/Meta-Llama-3-8B, plus a .bin a careless upload might add
    ".gitattributes",
    "LICENSE",
    "README.md",
    "USE_POLICY.md",
    "config.json",
    "generation_config.json",
    "model-00001-of-00004.safetensors",
    "model-00002-of-00004.safetensors",
    "model-00003-of-00004.safetensors",
    "model-00004-of-00004.safetensors",
    "model.safetensors.index.json",
    "original/consolidated.00.pth",
    "original/params.json",
    "original/tokenizer.model",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "pytorch_model.bin",
]
MISTRAL_V03_FILES = [  # mistralai/Mistral-7B-v0.3: consolidated.safetensors duplicates the shards
    "config.json",
    "consolidated.safetensors",
    "generation_config.json",
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
    "model.safetensors.index.json",
    "params.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer.model.v3",
    "tokenizer_config.json",
]
GPT2_FILES = [  # openai-community/gpt2 (abridged)
    "64-8bits.tflite",
    "config.json",
    "flax_model.msgpack",
    "generation_config.json",
    "merges.txt",
    "model.safetensors",
    "onnx/decoder_model.onnx",
    "onnx/config.json",
    "pytorch_model.bin",
    "rust_model.ot",
    "tf_model.h5",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
]
BIN_ONLY_FILES = ["config.json", "pytorch_model.bin", "tokenizer.json"]


@pytest.fixture
def fake_snapshot_download(monkeypatch, tmp_path, online):
    """Replace snapshot_download by one that 'downloads' the files of ``repo_files`` its patterns select."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    state = {"files": [], "fetched": []}

    def fake(
        repo_id, *, revision=None, cache_dir=None, allow_patterns=None, ignore_patterns=None, local_files_only=False
    ):
        snap = os.path.join(cache_dir, "snapshots", "0" * 40)
        picked = list(
            filter_repo_objects(state["files"], allow_patterns=allow_patterns, ignore_patterns=ignore_patterns)
        )
        for name in picked:
            path = os.path.join(snap, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                if name.endswith(".index.json"):
                    json.dump(
                        {
                            "weight_map": {
                                f"w{i}": s
                                for i, s in enumerate(state["files"])
                                if s.startswith("model-") and s.endswith(".safetensors")
                            }
                        },
                        f,
                    )
        state["fetched"] += picked
        os.makedirs(snap, exist_ok=True)
        return snap

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return state


@pytest.mark.parametrize(
    "files, expected",
    [
        (
            LLAMA3_FILES,
            [
                "config.json",
                "generation_config.json",
                "model-00001-of-00004.safetensors",
                "model-00002-of-00004.safetensors",
                "model-00003-of-00004.safetensors",
                "model-00004-of-00004.safetensors",
                "model.safetensors.index.json",
                "special_tokens_map.json",
                "tokenizer.json",
                "tokenizer_config.json",
            ],
        ),
        (
            MISTRAL_V03_FILES,
            [
                "config.json",
                "generation_config.json",
                "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors",
                "model.safetensors.index.json",
                "special_tokens_map.json",
                "tokenizer.json",
                "tokenizer.model",
                "tokenizer_config.json",
            ],
        ),
        (
            GPT2_FILES,
            [
                "config.json",
                "generation_config.json",
                "merges.txt",
                "model.safetensors",
                "tokenizer.json",
                "tokenizer_config.json",
                "vocab.json",
            ],
        ),
    ],
)
def test_download_fetches_only_config_tokenizer_and_safetensors(fake_snapshot_download, tmp_path, files, expected):
    fake_snapshot_download["files"] = files
    hub.download_model("org/name", cache_dir=str(tmp_path))
    assert sorted(set(fake_snapshot_download["fetched"])) == expected


def test_dummy_fetches_no_weights(fake_snapshot_download, tmp_path):
    fake_snapshot_download["files"] = LLAMA3_FILES
    hub.download_model("org/name", cache_dir=str(tmp_path), weights=False)
    assert not any(f.endswith((".safetensors", ".bin", ".pth")) for f in fake_snapshot_download["fetched"])


def test_repo_with_only_bin_weights(fake_snapshot_download, tmp_path):
    fake_snapshot_download["files"] = BIN_ONLY_FILES
    with pytest.raises(
        ModelNotFoundError,
        match=r"has no safetensors weights at its top level \(attnserve does not "
        r"load PyTorch .bin/.pth checkpoints\)",
    ):
        hub.download_model("org/name", cache_dir=str(tmp_path))
    assert "pytorch_model.bin" not in fake_snapshot_download["fetched"]


# --- load_format dummy from a bare config.json -------------------------------------------------------------


@pytest.fixture(scope="module")
def config_only(tmp_path_factory, tiny_model_dir):
    folder = str(tmp_path_factory.mktemp("config-only"))
    shutil.copyfile(os.path.join(tiny_model_dir("llama"), "config.json"), os.path.join(folder, "config.json"))
    return folder


def test_dummy_from_config_json_alone(config_only, caplog):
    with caplog.at_level("WARNING"):
        llm = LLM(config_only, load_format="dummy", **CPU)
    assert "has no tokenizer files; random (dummy) weights run with the default model's tokenizer" in caplog.text
    outs = llm.generate(PROMPTS, GREEDY)
    assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8]
    assert llm.generate("text works too", SamplingParams(max_tokens=2, ignore_eos=True))[0].outputs[0].text is not None


def test_dummy_from_hub_config_only(config_only, offline, tmp_path):
    add_to_hub_cache(config_only, str(tmp_path), "org/shape-only")
    llm = LLM("org/shape-only", load_format="dummy", download_dir=str(tmp_path), **CPU)
    assert [len(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)] == [8, 8]


def test_config_only_without_dummy_says_the_weights_are_missing(config_only):
    # the weights are what is missing, not only the tokenizer: the message says how to run the shape
    with pytest.raises(
        ModelNotFoundError,
        match=r"has no weights \(no \.safetensors files\) and no tokenizer files: "
        r"pass --load-format dummy for random weights",
    ):
        LLM(config_only, **CPU)


def test_weights_without_tokenizer_files_ask_for_tokenizer(config_only, tmp_path, tiny_model_dir):
    folder = str(tmp_path / "weights-only")
    shutil.copytree(config_only, folder)
    src = tiny_model_dir("llama")
    for f in os.listdir(src):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            shutil.copyfile(os.path.join(src, f), os.path.join(folder, f))
    with pytest.raises(ModelNotFoundError, match=r"has no tokenizer files .*: pass --tokenizer"):
        LLM(folder, **CPU)


def test_dummy_with_a_vocab_too_small_for_the_default_tokenizer(config_only, tmp_path):
    cfg = json.load(open(os.path.join(config_only, "config.json")))
    cfg["vocab_size"] = 32000  # Mistral's: the default tokenizer's 49152 ids would overflow it
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelNotFoundError, match="do not fit its vocab_size 32000: pass --tokenizer"):
        LLM(str(tmp_path), load_format="dummy", **CPU)


def test_serve_fails_before_starting_for_a_missing_hub_model(offline, tmp_path, capsys):
    rc = main(["serve", "org/not-cached", "--download-dir", str(tmp_path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("attnserve serve: error: hub model 'org/not-cached' is not in the Hugging Face cache")


def test_tokenizer_from_another_cached_repo_or_a_bare_folder(hub_cache, config_only, folder_llm, offline, tmp_path):
    cache, folder, _ = hub_cache
    tok_only = tmp_path / "tok"
    tok_only.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(folder, name), tok_only / name)
    add_to_hub_cache(str(tok_only), cache, "org/tokenizer-only")  # a tokenizer repo needs no config.json
    for tok in ("org/tokenizer-only", str(tok_only)):
        llm = LLM(config_only, load_format="dummy", tokenizer=tok, download_dir=cache, **CPU)
        assert llm.tokenizer.encode("hello world") == folder_llm.tokenizer.encode("hello world")


def test_bench_latency_runs_on_a_bare_config_json_with_dummy_weights(config_only, tmp_path):
    from attnserve.entrypoints.cli.main import main

    out = tmp_path / "lat.json"
    rc = main(
        [
            "bench",
            "latency",
            "--model",
            config_only,
            "--load-format",
            "dummy",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--batch-size",
            "2",
            "--input-len",
            "6",
            "--output-len",
            "3",
            "--num-iters",
            "1",
            "--no-progress",
            "--output-json",
            str(out),
        ]
    )
    assert rc == 0
    (row,) = [r for r in json.loads(out.read_text())["results"] if r["batch_size"] == 2]
    assert row["output_len"] == 3 and row["input_len"] == 6
