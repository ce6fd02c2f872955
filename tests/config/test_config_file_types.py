"""Config-file values of the wrong type: every key's error names the key, the value as the file writes it, its type
and what is allowed; a number written as text is that number, as on the command line (and in vLLM's --config, which
passes every value through argparse as text). Found by a fresh-user trial: ``block_size: "32"`` read "'32' not
allowed (allowed: 1, 2, 4, 8, 16, 32, ...)"."""

import json

import pytest

from attnserve.config import AttentionConfig, ConfigError
from attnserve.config.engine_arg_table import engine_args
from attnserve.config.engine_args import resolve
from attnserve.config.fields import allowed_values, field_types, split_optional
from attnserve.config.files import file_settings

# (file key, the dataclass and field declaring it), every key a file takes but vLLM's other names
KEYS = [(name, arg.owner, name) for name, arg in engine_args().items()] + [
    (f"attention_config.{name}", AttentionConfig, name) for name in AttentionConfig.field_names() if name != "backend"
]
EXPECTED = {int: "an integer", float: "a number", bool: "a boolean", str: "a string"}
# per type of field: values of other types, as a YAML file writes them, and what each is
WRONG = {
    int: [
        ("32.0", "a float"),
        ("true", "a boolean"),
        ("[32]", "a list"),
        ("{a: 1}", "a mapping"),
        ("2024-01-01", "a date"),
    ],
    float: [("true", "a boolean"), ("[0.5]", "a list")],
    bool: [("'true'", "a string"), ("1", "an integer"), ("1.0", "a float"), ("[true]", "a list")],
    str: [("5", "an integer"), ("true", "a boolean"), ("1.5", "a float"), ("[a]", "a list")],
}
# a list or mapping in an error: as JSON writes it
SPELLED = {"{a: 1}": '{"a": 1}', "[a]": '["a"]', "[FLASH_ATTN]": '["FLASH_ATTN"]'}


def _type(owner: type, name: str) -> type:
    """The field's type, without ``| None``."""
    return split_optional(field_types(owner)[name])[0]


def _error(tmp_path, text: str) -> str:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        resolve(file_settings(str(p)))
    return str(e.value).replace(str(p), "cfg.yaml")


def _refusal(tmp_path, text: str):
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        resolve(file_settings(str(p)))
    assert e.value.refusal.origin == str(p)
    return e.value.refusal


def _resolved(tmp_path, text: str):
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return resolve(file_settings(str(p))).config


CASES = [(key, owner, name, text, kind) for key, owner, name in KEYS for text, kind in WRONG[_type(owner, name)]]


@pytest.mark.parametrize("key, owner, name, text, kind", CASES, ids=[f"{c[0]}={c[3]}" for c in CASES])
def test_every_key_names_the_type_of_a_wrong_value(tmp_path, key, owner, name, text, kind):
    r = _refusal(tmp_path, f"{key}: {text}\n")
    assert (r.path, r.kind, r.noun, r.allowed) == (
        tuple(key.split(".")),
        kind,
        EXPECTED[_type(owner, name)],
        allowed_values(owner, name),
    )


def test_a_wrong_value_is_spelled_as_the_file_writes_it(tmp_path):
    """The golden line: a list as JSON, a boolean as YAML writes it."""
    assert _error(tmp_path, "block_size: {a: 1}\n") == (
        'cfg.yaml: block_size {"a": 1} is a mapping, not an integer (allowed: 1, 2, 4, 8, 16, 32, 64, 128, 256)'
    )
    assert _error(tmp_path, "enforce_eager: 1.0\n") == (
        "cfg.yaml: enforce_eager 1.0 is a float, not a boolean (allowed: true, false)"
    )


@pytest.mark.parametrize("text, kind", [("32", "an integer"), ("true", "a boolean"), ("[FLASH_ATTN]", "a list")])
def test_the_backend_names_the_type_of_a_wrong_value(tmp_path, text, kind):
    for key in ("attention_backend", "attention_config.backend"):
        assert _error(tmp_path, f"{key}: {text}\n") == (
            f"cfg.yaml: {key} {SPELLED.get(text, text)} is {kind}, not a backend name (allowed: FLASH_ATTN, FLASHINFER, "
            "TRITON_ATTN, FLEX_ATTENTION, CPU_ATTN, CUSTOM, auto, null)"
        )


# a valid value of every integer and number field, written as text
NUMBERS = {
    "max_model_len": "4096",
    "seed": "7",
    "block_size": "32",
    "num_gpu_blocks": "64",
    "kv_cache_memory": "1000",
    "gpu_memory_utilization": "0.5",
    "max_num_batched_tokens": "4096",
    "max_num_seqs": "8",
    "tensor_parallel_size": "2",
    "attention_config.flash_attn_version": "3",
    "attention_config.flash_attn_max_num_splits_for_cuda_graph": "64",
    "max_logprobs": "5",
}
assert set(NUMBERS) == {key for key, owner, name in KEYS if _type(owner, name) in (int, float)}


def _value(config, key: str):
    if key.startswith("attention_config."):
        return getattr(config.attention, key.split(".", 1)[1])
    arg = engine_args()[key]
    return getattr(getattr(config, arg.section) if arg.section else config, key)


@pytest.mark.parametrize("key", list(NUMBERS))
def test_a_number_written_as_text_is_that_number(tmp_path, key):
    """As the command line reads ``--block-size 32`` and vLLM's --config reads ``block_size: "32"``."""
    config = _resolved(tmp_path, f"{key}: {json.dumps(NUMBERS[key])}\n")
    value = _value(config, key)
    assert value == float(NUMBERS[key]) and type(value) is (float if key == "gpu_memory_utilization" else int)
    nested = key.replace("attention_config.", "attention_config:\n  ")  # the nested form too
    assert _value(_resolved(tmp_path, f"{nested}: {json.dumps(NUMBERS[key])}\n"), key) == value


@pytest.mark.parametrize(
    "text, key, value",
    [
        ('max_model_len: "32k"', "max_model_len", 32000),  # vLLM's suffixes, as before
        ("max_model_len: 32K", "max_model_len", 32768),
        ('max_model_len: "null"', "max_model_len", None),  # as --max-model-len null
        ("num_gpu_blocks_override: '64'", "num_gpu_blocks", 64),  # vLLM's name
        ("gpu_memory_utilization: 5e-1", "gpu_memory_utilization", 0.5),  # YAML 1.1 reads 5e-1 as text
        ("max_num_seqs: ' 8 '", "max_num_seqs", 8),  # int(' 8 '), as argparse
    ],
)
def test_text_read_as_the_command_line_reads_it(tmp_path, text, key, value):
    assert _value(_resolved(tmp_path, text + "\n"), key) == value


@pytest.mark.parametrize(
    "text, line",
    [
        # text that is no number: the command line's words (argument --block-size: '32.0' is not an integer ...)
        (
            'block_size: "32.0"',
            (("block_size",), "32.0", "1, 2, 4, 8, 16, 32, 64, 128, 256"),
        ),
        (
            "block_size: 'null'",
            (("block_size",), "null", "1, 2, 4, 8, 16, 32, 64, 128, 256"),
        ),
        ("tensor_parallel_size: 1e3", (("tensor_parallel_size",), "1e3", "integer >= 1")),
        (
            "gpu_memory_utilization: half",
            (("gpu_memory_utilization",), "half", "number in (0, 1]"),
        ),
        (
            "attention_config:\n  flash_attn_version: three",
            (("attention_config", "flash_attn_version"), "three", "2, 3, 4, null"),
        ),
        (
            "max_model_len: 8KiB",
            (
                ("max_model_len",),
                "8KiB",
                "integer >= 1, null; suffixes as in vLLM: k, m, g, t = 10^3, 10^6, 10^9, 10^12 (with a fraction: 1.5k); K, M, G, T = 2^10, 2^20, 2^30, 2^40 (whole numbers only)",
            ),
        ),
        # a number that is read, then out of range: as the flag's
        ('block_size: "7"', (("block_size",), 7, "1, 2, 4, 8, 16, 32, 64, 128, 256")),
        # only numbers are read from text: a boolean is true or false, as a flag takes no value
        ("enforce_eager: 'false'", (("enforce_eager",), "false", "true, false")),
        (
            "attention_config:\n  use_trtllm_attention: 'null'",
            (("attention_config", "use_trtllm_attention"), "null", "true, false, null"),
        ),
    ],
)
def test_text_that_is_not_the_fields_type(tmp_path, text, line):
    r = _refusal(tmp_path, text + "\n")
    assert (r.path, r.value, r.allowed) == line
