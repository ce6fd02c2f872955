"""Config files: YAML/JSON, nested and dotted attention_config, kept false values, errors with file:line:col."""

import datetime

import pytest

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.config import ConfigError
from attnserve.config.engine_args import resolve
from attnserve.config.files import file_settings
from attnserve.refusals import TEXT


def load(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return resolve(file_settings(str(p))).config, str(p)


def test_yaml_nested_attention_and_dashes(tmp_path):
    cfg, _ = load(
        tmp_path,
        "c.yaml",
        "model: m\nblock-size: 32\nattention_config:\n  backend: flashinfer\n  use-trtllm-attention: false\n",
    )
    assert cfg.model.model == "m" and cfg.cache.block_size == 32
    assert cfg.attention.backend is AttentionBackendEnum.FLASHINFER
    assert cfg.attention.use_trtllm_attention is False


def test_yaml_dotted_attention_keys(tmp_path):
    cfg, _ = load(tmp_path, "c.yml", "attention_config.backend: FLASH_ATTN\nattention-config.flash_attn_version: 3\n")
    assert (cfg.attention.backend, cfg.attention.flash_attn_version) == (AttentionBackendEnum.FLASH_ATTN, 3)


def test_yaml_false_values_kept(tmp_path):
    cfg, _ = load(tmp_path, "c.yaml", "enable_chunked_prefill: false\nenforce_eager: false\n")
    assert cfg.scheduler.enable_chunked_prefill is False  # default is True: a dropped false would show


def test_json_file(tmp_path):
    cfg, _ = load(
        tmp_path, "c.json", '{"model": "m", "attention_config": {"backend": "FLASH_ATTN", "flash_attn_version": 4}}'
    )
    assert cfg.attention.flash_attn_version == 4


YAML_ALLOWED = "(allowed: a mapping of engine argument names to values, e.g. 'dtype: float32', or {} for no settings)"
JSON_ALLOWED = (
    '(allowed: a mapping of engine argument names to values, e.g. {"dtype": "float32"}, or {} for no settings)'
)


@pytest.mark.parametrize(
    "name, text, message",
    [
        # a file named on the command line that sets nothing is most likely the wrong file: one error in both formats
        # (the empty YAML file was read as no settings, the empty JSON file was "malformed JSON: Expecting value")
        ("c.yaml", "", f"empty config file {YAML_ALLOWED}"),
        ("c.yml", " \n\n", f"empty config file {YAML_ALLOWED}"),
        ("c.json", "", f"empty config file {JSON_ALLOWED}"),
        ("c.json", "\n  \n", f"empty config file {JSON_ALLOWED}"),
        ("c.yaml", "# block_size: 32\n", f"the config file holds only comments {YAML_ALLOWED}"),
        ("c.yaml", "null\n", f"the top level is null {YAML_ALLOWED}"),
        ("c.json", "null", f"the top level is null {JSON_ALLOWED}"),
        # a top level that is no mapping (was "... must be a mapping ..., got list")
        ("c.yaml", "- block_size: 32\n- dtype: float32\n", f"the top level is a list {YAML_ALLOWED}"),
        ("c.json", '[{"block_size": 32}]', f"the top level is a list {JSON_ALLOWED}"),
        ("c.yaml", "block_size 32\n", f"the top level is the string 'block_size 32' {YAML_ALLOWED}"),
        ("c.yaml", "32\n", f"the top level is the number 32 {YAML_ALLOWED}"),
        ("c.yaml", "true\n", f"the top level is true {YAML_ALLOWED}"),
    ],
)
def test_a_file_without_a_mapping_is_one_error_naming_it(tmp_path, name, text, message):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        file_settings(str(p))
    assert str(e.value) == f"{p}: {message}"


@pytest.mark.parametrize("name", ["c.yaml", "c.json"])
def test_an_empty_mapping_sets_nothing(tmp_path, name):
    cfg, _ = load(tmp_path, name, "{}\n")
    assert cfg.model.model is None and cfg.cache.block_size == 16


@pytest.mark.parametrize(
    "name, text, pattern",
    [
        ("c.yaml", "blok_size: 16\n", r"unknown key 'blok_size' in {p} .*did you mean 'block_size'\?"),
        # vLLM's names are valid keys too, listed after ours, and suggested as written
        (
            "c.yaml",
            "num_gpu_block_override: 16\n",
            r"unknown key 'num_gpu_block_override' in {p} \(allowed: .*, num_gpu_blocks, "
            r"num_gpu_blocks_override, kv_cache_memory, kv_cache_memory_bytes, .*\); did you mean 'num_gpu_blocks_override'\?$",
        ),
        (
            "c.yaml",
            "attention_config:\n  bakend: X\n",
            r"unknown attention_config field 'bakend' in {p} .*did you mean 'backend'\?",
        ),
        ("c.yaml", "attention_config.bakend: X\n", r"unknown attention_config field 'bakend' in {p}"),
        ("c.yaml", "model: m\n  x: [1,\n", r"^{p}:2:4: malformed YAML: "),
        ("c.yaml", "a: [1, 2\n", r"^{p}:2:1: malformed YAML: "),
        ("c.json", '{\n  "model": "m",\n  "block_size" 16\n}', r"^{p}:3:16: malformed JSON: Expecting ':' delimiter"),
        ("c.json", '{"model": "a", "model": "b"}', r"^{p}: duplicate key 'model'"),
        ("c.yaml", "model: a\nmodel: b\n", r"^{p}:2:1: malformed YAML: duplicate key 'model'"),
        ("c.yaml", "block_size: 0\n", r"^{p}: block_size 0 not allowed \(allowed: 1, 2, 4, 8, 16, 32, 64, 128, 256\)$"),
        ("c.yaml", "block_size: 7\n", r"^{p}: block_size 7 not allowed \(allowed: 1, 2, 4, 8, 16, 32, 64, 128, 256\)$"),
        ("c.yaml", "block_size: 16.0\n", r"^{p}: block_size 16.0 is a float, not an integer \(allowed: 1, 2, 4, "),
        (
            "c.yaml",
            "attention_config:\n  flash_attn_version: 5\n",
            r"^{p}: attention_config.flash_attn_version 5 not allowed",
        ),
        ("c.yaml", "attention_config: FLASH_ATTN\n", r"{p}: attention_config 'FLASH_ATTN' is not an object"),
    ],
)
def test_errors_name_file(tmp_path, name, text, pattern):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        resolve(file_settings(str(p)))
    import re

    assert re.search(pattern.format(p=re.escape(str(p))), str(e.value)), str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file .*No such file"):
        file_settings(str(tmp_path / "nope.yaml"))


def test_mutual_exclusion_inside_a_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("attention_backend: FLASHINFER\nattention_config:\n  backend: FLASH_ATTN\n")
    with pytest.raises(
        ConfigError,
        match=rf"attention_backend in {p} 'FLASHINFER' conflicts with attention_config.backend in {p} 'FLASH_ATTN'",
    ):
        resolve(file_settings(str(p)))


@pytest.mark.parametrize(
    "name, text, message",
    [
        # a value is shown as the file writes it, not as Python does (was True, None, datetime.date(2024, 1, 1))
        (
            "c.yaml",
            "dtype: true\n",
            (("dtype",), True, "auto, float32, float16, bfloat16, float, half"),
        ),
        (
            "c.yaml",
            "kv_cache_dtype: null\n",
            (("kv_cache_dtype",), None, "auto, fp8, fp8_e4m3, fp8_e5m2"),
        ),
        (
            "c.yaml",
            "kv_cache_dtype: ~\n",
            (("kv_cache_dtype",), None, "auto, fp8, fp8_e4m3, fp8_e5m2"),
        ),
        ("c.json", '{"enforce_eager": null}', (("enforce_eager",), None, "true, false")),
        (
            "c.yaml",
            "gpu_memory_utilization: 1000.0\n",
            (("gpu_memory_utilization",), 1000.0, "number in (0, 1]"),
        ),
        (
            "c.yaml",
            "block_size: [16, true]\n",
            (("block_size",), [16, True], "1, 2, 4, 8, 16, 32, 64, 128, 256"),
        ),
        (
            "c.yaml",
            "max_model_len: 2024-01-01\n",
            (("max_model_len",), datetime.date(2024, 1, 1), "integer >= 1, null"),
        ),
        (
            "c.yaml",
            "enforce_eager: 'true'\n",
            (("enforce_eager",), "true", "true, false"),
        ),  # text stays quoted
        (
            "c.yaml",
            "attention_backend: false\n",
            (
                ("attention_backend",),
                False,
                "FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, CPU_ATTN, CUSTOM, auto, null",
            ),
        ),
        (
            "c.yaml",
            "attention_config:\n  flash_attn_version: true\n",
            (("attention_config", "flash_attn_version"), True, "2, 3, 4, null"),
        ),
        ("c.yaml", "attention_config: true\n", "{p}: attention_config true is not an object of field names to values"),
        (
            "c.yaml",
            "attention_backend: null\nattention_config:\n  backend: FLASH_ATTN\n",
            "attention_backend in {p} null conflicts with attention_config.backend in {p} 'FLASH_ATTN': they name different "
            "backends; set the attention backend in one place",
        ),
    ],
)
def test_values_in_errors_are_spelled_as_in_the_file(tmp_path, name, text, message):
    """The record, placed in the file and spelled as the file writes it (TEXT); a str: a line with no such record."""
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        resolve(file_settings(str(p)))
    if isinstance(message, str):
        assert str(e.value) == message.format(p=p)
        return
    r = e.value.refusal
    assert (r.path, r.value, r.allowed, r.origin, r.written) == (*message, str(p), TEXT)


def test_unknown_keys_that_are_not_text_are_spelled_as_in_the_file(tmp_path):
    for text, start in (
        ("true: 1\n", "unknown key true in {p} (allowed: model, "),
        ("attention_config:\n  null: 1\n", "unknown attention_config field null in {p} (allowed: backend, "),
    ):
        p = tmp_path / "c.yaml"
        p.write_text(text)
        with pytest.raises(ConfigError) as e:
            resolve(file_settings(str(p)))
        assert str(e.value).startswith(start.format(p=p)), str(e.value)


def test_python_keywords_keep_python_spelling():
    """LLM(dtype=True) is Python: True, None as written there."""
    from attnserve.config.engine_args import build_engine_config

    with pytest.raises(ConfigError) as e:
        build_engine_config(enforce_eager=None)
    assert str(e.value) == "enforce_eager None not allowed (allowed: true, false)" and e.value.key == "enforce_eager"
    with pytest.raises(ConfigError, match=r"^attention_config True is not an object"):
        build_engine_config(attention_config=True)


@pytest.mark.parametrize(
    "name, text, want",
    [
        ("c.yaml", "block_size: 16\nblock-size: 32\n", (("block_size",), 32, "block-size", "block_size 16")),
        (
            "c.json",
            '{"num_gpu_blocks": 5, "num_gpu_blocks_override": 6}',
            (("num_gpu_blocks",), 6, "num_gpu_blocks_override", "num_gpu_blocks 5"),
        ),
        (
            "c.yaml",
            "kv_cache_memory_bytes: 1G\nkv-cache-memory: 2G\n",
            (("kv_cache_memory",), 2 << 30, "kv-cache-memory", f"kv_cache_memory_bytes {1 << 30}"),
        ),
        (
            "c.yaml",
            "attention_config:\n  backend: FLASH_ATTN\nattention_config.backend: FLASHINFER\n",
            (
                ("attention_config", "backend"),
                "FLASHINFER",
                "attention_config.backend",
                "backend in attention_config 'FLASH_ATTN'",
            ),
        ),
        (
            "c.yaml",
            "attention-config.flash_attn_version: 3\nattention_config:\n  flash-attn-version: 2\n",
            (
                ("attention_config", "flash_attn_version"),
                2,
                "flash-attn-version in attention_config",
                "attention-config.flash_attn_version 3",
            ),
        ),
    ],
)
def test_two_spellings_of_one_setting_in_one_file_with_two_values(tmp_path, name, text, want):
    """Neither spelling is "the later": the file is refused, naming both spellings and both values."""
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        resolve(file_settings(str(p)))
    r = e.value.refusal
    path, value, subject, other = want
    assert (r.path, r.value, r.subject, r.origin, r.key) == (path, value, subject, str(p), ".".join(path))
    assert r.reason == f"conflicts with {other}: two spellings of one setting" and r.advice == "give it once"


def test_two_spellings_of_one_setting_with_one_value(tmp_path):
    cfg, _ = load(
        tmp_path,
        "c.yaml",
        "block_size: 32\nblock-size: '32'\nnum_gpu_blocks_override: 600\nnum_gpu_blocks: 600\n"
        "attention_config:\n  backend: flash_attn\nattention_config.backend: FLASH_ATTN\n",
    )
    assert (cfg.cache.block_size, cfg.cache.num_gpu_blocks) == (32, 600)
    assert cfg.attention.backend is AttentionBackendEnum.FLASH_ATTN


def test_two_files_and_the_command_line_still_override(tmp_path):
    """Precedence between places is unchanged: a later file's other spelling overrides an earlier file's."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("num_gpu_blocks: 5\n")
    b.write_text("num_gpu_blocks_override: 6\n")
    assert resolve(file_settings(str(a)) + file_settings(str(b))).config.cache.num_gpu_blocks == 6


def test_two_spellings_in_one_python_call():
    from attnserve.config.engine_args import build_engine_config

    with pytest.raises(ConfigError) as e:
        build_engine_config(num_gpu_blocks=5, num_gpu_blocks_override=6)
    r = e.value.refusal
    assert (r.path, r.value, r.subject, r.origin) == (("num_gpu_blocks",), 6, "num_gpu_blocks_override=", "")
    assert r.reason == "conflicts with num_gpu_blocks= 5: two spellings of one setting"
    with pytest.raises(ConfigError) as e:
        build_engine_config(attention_config={"flash_attn_version": 3, "flash-attn-version": 2})
    assert (e.value.key, e.value.value, e.value.refusal.subject) == (
        "attention_config.flash_attn_version",
        2,
        "attention_config['flash-attn-version']",
    )
    assert build_engine_config(kv_cache_memory=1 << 30, kv_cache_memory_bytes=1 << 30).cache.kv_cache_memory == 1 << 30
