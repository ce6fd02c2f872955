"""AttentionConfig: parsing, validation, closed fields, docstrings (design §1, §7)."""

import dataclasses

import pytest

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.config import AttentionConfig, ConfigError
from attnserve.config.fields import field_docs


@pytest.mark.parametrize("name", ["flash_attn", "FLASH_ATTN", "Flash_Attn", "flash-attn", " FLASH_ATTN "])
def test_backend_names_are_case_insensitive(name):
    assert AttentionConfig(backend=name).backend is AttentionBackendEnum.FLASH_ATTN


@pytest.mark.parametrize("name", ["auto", "AUTO", "Auto", "", None])
def test_auto_means_automatic_selection(name):
    assert AttentionConfig(backend=name).backend is None


def test_enum_member_accepted():
    assert AttentionConfig(backend=AttentionBackendEnum.FLASHINFER).backend is AttentionBackendEnum.FLASHINFER


def test_unknown_backend_lists_valid_names_and_suggests():
    with pytest.raises(ConfigError) as e:
        AttentionConfig(backend="FLASH_ATTENTION")
    msg = str(e.value)
    assert "'FLASH_ATTENTION'" in msg and "did you mean 'FLASH_ATTN'?" in msg
    for member in AttentionBackendEnum:
        assert member.name in msg
    assert "\n" not in msg


def test_backend_of_wrong_type():
    with pytest.raises(ConfigError) as e:
        AttentionConfig(backend=3)
    assert str(e.value) == (
        "attention_config.backend 3 is an integer, not a backend name (allowed: FLASH_ATTN, FLASHINFER, "
        "TRITON_ATTN, FLEX_ATTENTION, CPU_ATTN, CUSTOM, auto, null)"
    )


@pytest.mark.parametrize("version", [2, 3, 4, None])
def test_flash_attn_version_allowed(version):
    assert AttentionConfig(flash_attn_version=version).flash_attn_version == version


@pytest.mark.parametrize(
    "version, kind",
    [
        (5, None),
        (1, None),
        (0, None),
        # another type: named, never "'3' not allowed (allowed: 2, 3, 4, null)"
        (True, "a boolean"),
        ("3", "a string"),
        (3.0, "a float"),
    ],
)
def test_flash_attn_version_rejected(version, kind):
    """The record: the field, the value, what is allowed and, for a value of another type, its kind."""
    with pytest.raises(ConfigError) as e:
        AttentionConfig(flash_attn_version=version)
    r = e.value.refusal
    assert (r.path, r.value, r.allowed, r.kind) == (
        ("attention_config", "flash_attn_version"),
        version,
        "2, 3, 4, null",
        kind,
    )
    assert r.noun == (kind and "an integer")


@pytest.mark.parametrize(
    "field, value, kind, allowed",
    [
        ("use_prefill_decode_attention", "true", "a string", "true, false"),
        ("use_prefill_decode_attention", None, None, "true, false"),
        ("use_trtllm_attention", 1, "an integer", "true, false, null"),
        ("disable_flashinfer_prefill", "yes", "a string", "true, false"),
        ("disable_flashinfer_q_quantization", 0, "an integer", "true, false"),
        ("flash_attn_max_num_splits_for_cuda_graph", 0, None, "integer in [1, 256]"),
        ("flash_attn_max_num_splits_for_cuda_graph", 257, None, "integer in [1, 256]"),
        ("flash_attn_max_num_splits_for_cuda_graph", True, "a boolean", "integer in [1, 256]"),
        ("flash_attn_max_num_splits_for_cuda_graph", "32", "a string", "integer in [1, 256]"),
    ],
)
def test_bad_values_name_field_value_and_allowed(field, value, kind, allowed):
    with pytest.raises(ConfigError) as e:
        AttentionConfig(**{field: value})
    r = e.value.refusal
    assert (r.path, r.value, r.allowed, r.kind) == (("attention_config", field), value, allowed, kind)
    assert e.value.key == f"attention_config.{field}"


def test_use_trtllm_attention_is_tri_state():
    for v in (None, True, False):
        assert AttentionConfig(use_trtllm_attention=v).use_trtllm_attention is v


def test_unknown_field_rejected_with_suggestion():
    with pytest.raises(ConfigError) as e:
        AttentionConfig.from_dict({"flash_attn_verison": 3})
    msg = str(e.value)
    assert "'flash_attn_verison'" in msg and "did you mean 'flash_attn_version'?" in msg
    assert "use_trtllm_attention" in msg  # lists the valid fields


def test_unknown_keyword_is_refused_as_an_unknown_key():
    """As a file's or -ac's unknown key: a ConfigError naming the fields allowed and the closest, not a TypeError."""
    with pytest.raises(ConfigError) as e:
        AttentionConfig(bakend="FLASH_ATTN")  # type: ignore[call-arg]
    r = e.value.refusal
    assert (r.value, r.subject, r.suggestion, r.key) == (
        "bakend",
        "unknown attention_config field",
        "backend",
        "attention_config.bakend",
    )
    assert r.allowed == ", ".join(AttentionConfig.field_names())
    with pytest.raises(ConfigError) as e:
        AttentionConfig(foo=1)  # type: ignore[call-arg]
    assert (e.value.value, e.value.refusal.suggestion) == ("foo", None)
    with pytest.raises(ConfigError) as e:
        AttentionConfig(**{"flash-attn-version": 3})  # a keyword is the field's name: from_dict takes dashes
    assert e.value.refusal.suggestion == "flash_attn_version"


def test_from_dict_accepts_dashes():
    cfg = AttentionConfig.from_dict({"flash-attn-version": 4, "backend": "flash_attn"})
    assert cfg == AttentionConfig(backend=AttentionBackendEnum.FLASH_ATTN, flash_attn_version=4)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        AttentionConfig().backend = None  # type: ignore[misc]


def test_every_field_has_a_docstring():
    docs = field_docs(AttentionConfig)
    assert set(docs) == set(AttentionConfig.field_names())
    assert all(len(d) > 20 for d in docs.values())


def test_unused_options_for_explicit_backend():
    cfg = AttentionConfig(backend="FLASHINFER", flash_attn_version=3, use_trtllm_attention=False)
    assert cfg.unused_options() == ["flash_attn_version"]
    assert AttentionConfig(flash_attn_version=3).unused_options() == []  # auto: the selector decides


def test_to_dict_roundtrip():
    cfg = AttentionConfig(backend="flashinfer", use_trtllm_attention=True)
    assert AttentionConfig.from_dict(cfg.to_dict()) == cfg
