"""Property tests of the argument layer (hypothesis).

1. Any valid mix of flags (every spelling), JSON and dotted attention options, and config files (YAML or
   JSON, nested or dotted attention keys, file values shadowed by the command line) gives the same
   EngineConfig as building it directly with ``build_engine_config``.
2. What ``attnserve config`` prints for any valid configuration, as a config file, gives that configuration.
3. Random junk arguments never raise anything but the clean usage error (exit 2, one line).
"""

import contextlib
import io
import json
import os
import tempfile

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.config import AttentionConfig, build_engine_config
from attnserve.config.engine_arg_table import engine_args
from attnserve.config.engine_args import engine_arg_values
from attnserve.config.fields import split_optional
from attnserve.entrypoints.cli.config import config_file_text
from attnserve.entrypoints.cli.engine_args import resolve_engine_args
from attnserve.entrypoints.cli.main import build_parser, main

BACKENDS = [m.name for m in AttentionBackendEnum] + ["auto"]
NAME = st.from_regex(r"[a-z][a-z0-9/._]{0,15}", fullmatch=True)


def cased(name: str):
    return st.sampled_from([name, name.lower(), name.title()])


def flat_value(arg):
    base, optional = split_optional(arg.type)
    meta = arg.field.metadata
    if arg.name == "calculate_kv_scales":  # true needs an fp8 cache (a cross-field rule, tested on its own)
        s = st.just(False)
    elif "choices" in meta:
        s = st.sampled_from(meta["choices"])
    elif base is bool:
        s = st.booleans()
    elif base is int:
        s = st.integers(min_value=meta.get("ge", 0), max_value=10**6)
    elif base is float:
        s = st.floats(min_value=0.01, max_value=1.0)
    elif arg.name == "device":
        s = st.sampled_from(["auto", "cpu", "cuda", "cuda:3"])
    elif arg.name == "generation_config":  # a folder name must exist: the two names that need none
        s = st.sampled_from(["auto", "vllm"])
    else:
        s = NAME
    return st.none() | s if optional else s


ATTN_VALUES = {
    "backend": st.sampled_from(BACKENDS).flatmap(cased),
    "flash_attn_version": st.sampled_from([2, 3, 4, None]),
    "use_prefill_decode_attention": st.booleans(),
    "flash_attn_max_num_splits_for_cuda_graph": st.integers(1, 256),
    "use_trtllm_attention": st.sampled_from([True, False, None]),
    "disable_flashinfer_prefill": st.booleans(),
    "disable_flashinfer_q_quantization": st.booleans(),
}
assert set(ATTN_VALUES) == set(AttentionConfig.field_names())


def spell(data, name: str) -> str:
    return "".join(data.draw(st.sampled_from("-_")) if c == "_" else c for c in name)


def cli_flat(data, name: str, value) -> list[str]:
    base, _ = split_optional(engine_args()[name].type) if name in engine_args() else (str, False)
    flag = "--" + spell(data, name)
    if base is bool:
        return [flag if value else "--no-" + flag[2:]]
    text = (
        data.draw(st.sampled_from(["null", "None"])) if value is None else repr(value) if base is float else str(value)
    )
    return [f"{flag}={text}"] if data.draw(st.booleans()) else [flag, text]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_valid_combination_matches_python(data):
    kwargs = {name: data.draw(flat_value(arg)) for name, arg in engine_args().items() if data.draw(st.booleans())}
    attention = {f: data.draw(s) for f, s in ATTN_VALUES.items() if data.draw(st.booleans())}
    backend_route = data.draw(st.sampled_from(["attention_config", "attention_backend"]))
    if "backend" in attention and backend_route == "attention_backend":
        kwargs["attention_backend"] = attention.pop("backend")

    file_values: dict = {}
    file_attention: dict = {}
    groups: list[list[str]] = []
    for name, value in kwargs.items():
        str_none = value is None and name in (
            "model",
            "tokenizer",
            "revision",
            "download_dir",
        )  # CLI: "null" is a string
        # a tri-state flag (bool | None: async_scheduling) has --X / --no-X on the command line; None only in a file
        bool_none = value is None and split_optional(engine_args()[name].type)[0] is bool
        where = "file" if str_none or bool_none else data.draw(st.sampled_from(["file", "cli", "both"]))
        if where in ("file", "both"):
            decoy = data.draw(flat_value(engine_args()[name])) if where == "both" and name in engine_args() else value
            file_values[spell(data, name)] = decoy if where == "both" else value
        if where in ("cli", "both"):
            if name == "model" and data.draw(st.booleans()):
                groups.append([value])  # positional MODEL
            else:
                groups.append(cli_flat(data, name, value))
    json_bucket: dict = {}
    for field, value in attention.items():
        where = data.draw(st.sampled_from(["file", "dotted", "json", "both"]))
        if where in ("file", "both"):
            file_attention[spell(data, field)] = data.draw(ATTN_VALUES[field]) if where == "both" else value
        if where in ("dotted", "both"):
            flag = data.draw(st.sampled_from(["--attention-config.", "-ac."])) + spell(data, field)
            text = value if field == "backend" else json.dumps(value)
            groups.append([f"{flag}={text}"] if data.draw(st.booleans()) else [flag, text])
        if where == "json":
            json_bucket[field] = value
    if json_bucket:
        groups.append([data.draw(st.sampled_from(["-ac", "--attention-config"])), json.dumps(json_bucket)])
    # a backend in the file's attention_config would conflict with a CLI --attention-backend: keep them apart
    if "attention_backend" in kwargs:
        file_attention = {k: v for k, v in file_attention.items() if k != "backend"}

    groups = data.draw(st.permutations(groups))
    argv = [tok for g in groups for tok in g]
    with tempfile.TemporaryDirectory() as d:
        if file_values or file_attention:
            if file_attention:
                if data.draw(st.booleans()):
                    file_values["attention_config"] = file_attention
                else:
                    file_values.update({f"attention_config.{k}": v for k, v in file_attention.items()})
            fmt = data.draw(st.sampled_from(["yaml", "json"]))
            path = os.path.join(d, f"cfg.{fmt}")
            with open(path, "w") as f:
                f.write(yaml.safe_dump(file_values) if fmt == "yaml" else json.dumps(file_values))
            flag = data.draw(st.sampled_from(["--config", "--config="] + (["--json-config"] if fmt == "json" else [])))
            file_args = [flag + path] if flag.endswith("=") else [flag, path]
            argv = file_args + argv if data.draw(st.booleans()) else argv + file_args
        args = build_parser("config").parse_args(["config", *argv])
        got = resolve_engine_args(args).config

    expected = build_engine_config(
        kwargs.pop("model", None),
        attention_backend=kwargs.pop("attention_backend", None),
        attention_config=attention,
        **kwargs,
    )
    assert got == expected, argv


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_printed_config_reads_back_the_same(data):
    """What ``attnserve config`` prints (``--format json`` or ``yaml``), as a config file, gives the same EngineConfig."""
    kwargs = {name: data.draw(flat_value(arg)) for name, arg in engine_args().items() if data.draw(st.booleans())}
    attention = {f: data.draw(s) for f, s in ATTN_VALUES.items() if data.draw(st.booleans())}
    config = build_engine_config(kwargs.pop("model", None), attention_config=attention, **kwargs)
    fmt = data.draw(st.sampled_from(["yaml", "json"]))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"cfg.{fmt}")
        with open(path, "w") as f:
            f.write(config_file_text(engine_arg_values(config), fmt))
        assert resolve_engine_args(build_parser("config").parse_args(["config", "--config", path])).config == config


def _junk_vocabulary() -> list[str]:
    parser = build_parser("config")
    flags = sorted(parser._subparsers._group_actions[0].choices["config"]._option_string_actions)  # type: ignore[union-attr]
    flags = [f for f in flags if f not in ("-h", "--help")]
    return flags + [
        "0",
        "-1",
        "16",
        "3.5",
        "x",
        "null",
        "true",
        "auto",
        "FLASH_ATTN",
        "flash-attn",
        "{",
        "}",
        "[1]",
        '{"backend": 1}',
        '{"backend": "FLASHINFER"}',
        '{"flash_attn_version": 5}',
        "=",
        "--",
        "-",
        "-ac.",
        "--attention-config.",
        "--attention-config.x",
        "--no-dtype",
        "--config=",
        "/nonexistent.yaml",
        "/tmp",
    ]


VOCAB = _junk_vocabulary()


@settings(max_examples=250, deadline=None)
@given(st.lists(st.sampled_from(VOCAB) | st.text(max_size=12), max_size=8))
def test_junk_arguments_give_a_clean_usage_error(tokens):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["config", *tokens])
        except SystemExit as e:
            rc = e.code
    if rc == 0:
        if "--explain" not in tokens:
            assert isinstance(yaml.safe_load(out.getvalue()), dict)  # JSON, or YAML with --format yaml
    else:
        assert rc == 2, (tokens, err.getvalue())
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("attnserve config: error: "), (tokens, err.getvalue())
