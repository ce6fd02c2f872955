"""Refusals as data: the record each surface refuses with, and one golden line per surface.

The same bad value, ``block_size 0``, refused by the Python API, the command line and a config file, and a bad
token id refused by the Python API and the server: the record's fields are the same; only the edge's formatter
differs (``attnserve/refusals.py``).
"""

from __future__ import annotations

import pickle

import pytest

from attnserve.config.engine_args import build_engine_config
from attnserve.config.fields import ConfigError
from attnserve.engine.request_checks import RequestValueError, check_token_ids
from attnserve.entrypoints.cli.main import main
from attnserve.refusals import JSON, MISSING, NO_VALUE, TEXT, Reason, Refusal, Refused, cli_line, message, openai_error

BLOCK_SIZES = "1, 2, 4, 8, 16, 32, 64, 128, 256"


def test_config_refusal_is_a_record():
    with pytest.raises(ConfigError) as e:
        build_engine_config("m", block_size=0)
    r = e.value.refusal
    assert (r.path, r.value, r.allowed, r.reason, r.setting) == (("block_size",), 0, BLOCK_SIZES, None, "block_size")
    assert isinstance(e.value, (Refused, ValueError))
    # golden: Python
    assert str(e.value) == f"block_size 0 not allowed (allowed: {BLOCK_SIZES})"


def test_cli_golden_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--block-size", "0"])
    assert e.value.code == 2
    assert (
        capsys.readouterr().err
        == f"attnserve generate: error: argument --block-size: 0 not allowed (allowed: {BLOCK_SIZES})\n"
    )


def test_file_refusal_names_the_file_and_spells_the_value_as_written(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text("enforce_eager: null\n")
    with pytest.raises(SystemExit):
        main(["generate", "--config", str(p)])
    assert capsys.readouterr().err == (
        f"attnserve generate: error: {p}: enforce_eager null not allowed (allowed: true, false)\n"
    )
    r = Refusal(("enforce_eager",), None, "true, false").at(str(p))
    assert (r.origin, r.names_path, r.written) == (str(p), False, TEXT)
    assert message(r) == f"{p}: enforce_eager null not allowed (allowed: true, false)"


def test_request_refusal_and_the_server_golden():
    with pytest.raises(RequestValueError) as e:
        check_token_ids([1, 50000], 49152)
    r = e.value.refusal
    assert (r.path, r.value, r.allowed) == (("prompt", 1), 50000, "integer in [0, 49152), the vocabulary size")
    assert str(e.value) == "prompt[1] 50000 not allowed (allowed: integer in [0, 49152), the vocabulary size)"
    # golden: the server's 400 (message, param)
    assert openai_error(r) == (
        "prompt.1: 50000 not allowed (allowed: integer in [0, 49152), the vocabulary size)",
        "prompt.1",
    )


def test_statement_forms():
    assert message(Refusal(("n",), "x", "integer", noun="an integer")) == "n 'x' is not an integer (allowed: integer)"
    assert message(Refusal(("n",), "32", "integer", kind="a string", noun="an integer")) == (
        "n '32' is a string, not an integer (allowed: integer)"
    )
    assert message(Refusal(("messages", 0, "content"), MISSING, "a string")) == (
        "messages[0].content missing (required: a string)"
    )
    assert message(Refusal(reason="malformed YAML: x", origin="c.yaml:2:1")) == "c.yaml:2:1: malformed YAML: x"
    assert (
        message(Refusal(("b",), "NOPE", "A, B", suggestion="B"))
        == "b 'NOPE' not allowed (allowed: A, B); did you mean 'B'?"
    )
    assert Refusal().value is NO_VALUE


def test_advice_names_settings_per_surface():
    r = Refusal(
        reason="KV-cache budget of 10 bytes holds no block", advice="raise {kv_cache_memory}", key="kv_cache_memory"
    )
    assert message(r) == "KV-cache budget of 10 bytes holds no block; raise kv_cache_memory"
    assert cli_line("attnserve generate", r.at("argument --kv-cache-memory", names_path=True)) == (
        "attnserve generate: error: argument --kv-cache-memory: KV-cache budget of 10 bytes holds no block; "
        "raise --kv-cache-memory"
    )


def test_values_are_spelled_by_surface():
    r = Refusal(("enforce_eager",), None, "true, false")
    assert message(r) == "enforce_eager None not allowed (allowed: true, false)"
    assert message(r.at("cfg.yaml")) == "cfg.yaml: enforce_eager null not allowed (allowed: true, false)"
    assert (
        openai_error(Refusal(("stop",), None, "a string", written=JSON))[0]
        == "stop: null not allowed (allowed: a string)"
    )
    # the allowed words too: Python's None is JSON's null
    r = Refusal(("allowed_token_ids",), [], "a non-empty list of token ids, or None")
    assert message(r) == "allowed_token_ids [] not allowed (allowed: a non-empty list of token ids, or None)"
    assert openai_error(r)[0] == "allowed_token_ids: [] not allowed (allowed: a non-empty list of token ids, or null)"


def test_reasons_are_records_and_cross_processes():
    r = Reason("block_size 8 not supported (multiples of 16)", "block_size", 8, "multiples of 16")
    back = pickle.loads(pickle.dumps(r))
    assert (back, back.field, back.value, back.rule) == (r, "block_size", 8, "multiples of 16")
    refusal = pickle.loads(pickle.dumps(ConfigError(Refusal(("block_size",), 0, "x"))))
    assert refusal.refusal == Refusal(("block_size",), 0, "x")


def test_server_validation_refusals_are_records():
    from pydantic import ValidationError

    from attnserve.entrypoints.openai.protocol import CompletionRequest
    from attnserve.refusals.server import validation_message, validation_refusals

    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate({"prompt": [[1, -2]], "n": 1.5})
    n, prompt = validation_refusals(e.value.errors(), CompletionRequest)  # in pydantic's order: the fields' own
    assert (prompt.path, prompt.value, prompt.allowed, prompt.noun) == (("prompt", 0, 1), -2, "integer >= 0", None)
    assert (n.path, n.value, n.allowed, n.noun) == (("n",), 1.5, "integer in [1, 128]", "an integer")
    # golden: the 400's message and param
    assert validation_message(e.value.errors(), CompletionRequest) == (
        "n: 1.5 is not an integer (allowed: integer in [1, 128]); prompt.0.1: -2 not allowed (allowed: integer >= 0)",
        "n",
    )


def test_selector_reasons_are_records():
    from attnserve.attention.selector import AttentionSelectorConfig, NoUsableBackendError, get_attn_backend
    from attnserve.platforms import detect_platform

    import torch

    from attnserve.attention.backend import AttentionType

    config = AttentionSelectorConfig(64, torch.float32, kv_cache_dtype="fp8", attn_type=AttentionType.ENCODER_ONLY)
    with pytest.raises(NoUsableBackendError) as e:
        get_attn_backend(None, config, detect_platform("cpu"))
    assert {name: [(r.field, r.value) for r in why] for name, why in e.value.reasons.items()} == {
        "CPU_ATTN": [("attn_type", AttentionType.ENCODER_ONLY)],
        "FLEX_ATTENTION": [("kv_cache_dtype", "fp8")],
    }
    assert e.value.key == "kv_cache_dtype"  # read from the reasons' fields: the one setting that would help


def test_the_refusals_package_imports_no_other_attnserve_package():
    """Every package raises and writes refusals: attnserve.refusals depends on none of them (no import cycle)."""
    import ast
    import pathlib

    import attnserve.refusals

    for path in pathlib.Path(attnserve.refusals.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert all(not n.startswith("attnserve") or n.startswith("attnserve.refusals") for n in names), (
                path,
                names,
            )


def test_refusals_pickle_with_their_record():
    from attnserve.engine.request_checks import PromptTooLongError
    from attnserve.engine.sampling_params import SamplingParamsError

    for error in (
        ConfigError(Refusal(("block_size",), 0, "x")),
        RequestValueError(("prompt", 1), -1, "integer >= 0"),
        PromptTooLongError(10, 8),
        SamplingParamsError("stop", "", "non-empty strings", index=1),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert (type(back), back.refusal, str(back), back.key) == (type(error), error.refusal, str(error), error.key)
    assert pickle.loads(pickle.dumps(SamplingParamsError("stop", "", "x", index=1))).index == 1
