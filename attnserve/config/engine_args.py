"""Engine arguments: flat names (``block_size``, ``attention_backend``, ...) -> one EngineConfig.

Every surface (CLI flags, config files, ``LLM(**kwargs)``) speaks in flat engine-argument names. The
name -> (sub-config, field) table is ``engine_arg_table.py``'s, derived from the dataclass fields of
EngineConfig's sub-configs, so a new field is a new flag, file key and keyword at once.

Each surface turns what the user gave into an ordered list of ``Setting``s (``settings.py``); ``resolve`` applies them
left to right (a later setting of the same key wins, so callers order them defaults < files < command
line; one key spelt two ways in one place with two values is refused), checks the ``attention_backend`` / ``attention_config.backend`` exclusion, builds the records
and names the flag, file or keyword of any bad value.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from attnserve.attention.registry import backend_name
from attnserve.config.attention import AttentionConfig, parse_backend
from attnserve.config.engine import EngineConfig
from attnserve.config.engine_arg_table import ATTENTION_BACKEND, ATTENTION_CONFIG, ATTENTION_PREFIX, engine_args
from attnserve.config.env import warn_ignored_vllm_env
from attnserve.config.fields import ConfigError, field_types, setting_path
from attnserve.config.settings import Setting, python_settings
from attnserve.config.unused import warn_unused_settings
from attnserve.refusals import PYTHON, TEXT, Refusal, spell_value
from attnserve.refusals.config import backends_conflict, spellings_conflict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolved:
    """The built EngineConfig and, per key that the user set, the Setting that won."""

    config: EngineConfig
    chosen: dict[str, Setting]

    def explain(self) -> list[tuple[str, Any, str]]:
        """``(engine argument, value, source)`` for every value of :func:`engine_arg_values` (an attention field as
        ``attention_config.FIELD``); source ``default`` when unset."""
        values = engine_arg_values(self.config)
        attention = values.pop(ATTENTION_CONFIG)
        values.update({ATTENTION_PREFIX + name: value for name, value in attention.items()})
        return [(key, value, self._source(key)) for key, value in values.items()]

    def _source(self, key: str) -> str:
        s = self.chosen.get(key)
        if s is None and key == ATTENTION_BACKEND:  # set as attention_config.backend
            s = self.chosen.get(ATTENTION_PREFIX + "backend")
        return s.source if s else "default"


def engine_arg_values(config: EngineConfig) -> dict[str, Any]:
    """``config`` in the flat form that config files, flags and ``LLM(...)`` speak, JSON-ready: each engine argument
    by its name (not vLLM's other names), then ``attention_backend`` (the backend's name; null: automatic) and
    ``attention_config`` (the other attention fields). What ``attnserve config`` prints; as a config file it gives
    ``config`` again: every value is a setting (none is derived from the model), and the backend is where a later
    ``--attention-backend`` overrides it."""
    cfg = config.to_dict()
    out = {arg.name: cfg[arg.section][arg.name] if arg.section else cfg[arg.name] for arg in engine_args().values()}
    attention = dict(cfg["attention"])
    out[ATTENTION_BACKEND] = attention.pop("backend")
    out[ATTENTION_CONFIG] = attention
    return out


def _shown(s: Setting) -> str:
    """The value of ``s`` in an error: as a file or the command line writes it (``true``, ``null``), as Python does
    for a keyword (``True``, ``None``)."""
    return spell_value(s.value) if s.where else repr(s.value)


def _located(e: ConfigError, s: Setting | None) -> ConfigError:
    """``e`` given where ``s`` was (``argument --block-size``, ``cfg.yaml``), its value spelled as there; a
    keyword's (no ``where``) as it is. A flag of its own names the setting, so the line does not (``argument
    --block-size: 0 not allowed``); a file, or a field inside ``-ac``'s JSON, does (``cfg.yaml: block_size 0 not
    allowed``)."""
    if s is None or not s.where:
        return e
    return ConfigError(e.refusal.at(s.where, names_path=s.own_flag))


def _given_in(s: Setting) -> str:
    """The one place whose settings are compared for two spellings: the command line, a file, a Python call."""
    return "command line" if s.cli else s.where


def _same_value(key: str, a: Any, b: Any) -> bool:
    """Whether two settings of ``key`` give one value: equal and of one type (``16`` is not ``16.0`` nor ``true``);
    backends by the backend they name (``flash_attn`` is ``FLASH_ATTN``)."""
    if key in (ATTENTION_BACKEND, ATTENTION_PREFIX + "backend"):
        try:
            return parse_backend(a, key=key) == parse_backend(b, key=key)
        except ConfigError:
            pass
    return type(a) is type(b) and a == b


def check_spellings(settings: list[Setting]) -> None:
    """Refuse one key given twice in one place (a file, the command line, a call) under two spellings with
    different values (``num_gpu_blocks`` and ``num_gpu_blocks_override``, ``block_size`` and ``block-size``,
    ``-ac '{"backend": ...}'`` and ``-ac.backend``): neither is "the later one" the user meant. The later is named
    first, as argparse names a flag that conflicts with an earlier one."""
    last: dict[tuple[str, str], Setting] = {}
    for s in settings:
        place = (_given_in(s), s.key)
        prev = last.get(place)
        last[place] = s
        if prev is None or not (prev.spelling and s.spelling) or prev.spelling == s.spelling:
            continue
        if _same_value(s.key, prev.value, s.value):
            continue
        head, other = (s.key, prev.label) if s.cli else (s.spelling, prev.spelling)  # the flag's place names it
        raise ConfigError(
            Refusal(
                setting_path(s.key),
                s.value,
                **spellings_conflict(other, _shown(prev)),
                subject=None if s.own_flag else head,
                key=s.key,
                origin=s.where,
                names_path=s.own_flag,
                written=TEXT if s.where else PYTHON,
            )
        )


def resolve(settings: Iterable[Setting]) -> Resolved:
    """Apply ``settings`` in order (later wins per key) and build the EngineConfig.

    Raises ConfigError with one line naming the flag/file/keyword, the value and what is allowed.
    """
    warn_ignored_vllm_env()
    settings = list(settings)
    check_spellings(settings)
    chosen: dict[str, Setting] = {}
    for s in settings:
        chosen[s.key] = s

    ab, cb = chosen.get(ATTENTION_BACKEND), chosen.get(ATTENTION_PREFIX + "backend")
    parsed = {}
    for s, key in ((ab, ATTENTION_BACKEND), (cb, ATTENTION_PREFIX + "backend")):
        if s is not None:
            try:
                parsed[key] = parse_backend(s.value, key=key)
            except ConfigError as e:
                raise _located(e, s) from None
    if ab is not None and cb is not None and len(set(parsed.values())) > 1:
        position = {id(s): i for i, s in enumerate(settings)}
        first, later = sorted((ab, cb), key=lambda s: position[id(s)])
        if _given_in(first) != _given_in(later):  # two places: the later one's precedence (command line > files)
            del chosen[first.key], parsed[first.key]
            ab, cb = (None, cb) if first is ab else (ab, None)
        else:  # one place, two spellings naming two backends
            other = first if later.cli else cb  # a flag: argparse's form, the flag that came second named first
            head = later if later.cli else ab
            raise ConfigError(
                Refusal(
                    value=head.value,
                    **backends_conflict(other.label, _shown(other)),
                    key=ATTENTION_BACKEND,
                    subject=None if head.cli else head.label,
                    origin=head.where if head.cli else "",
                    names_path=head.cli,
                    written=TEXT if head.where else PYTHON,
                )
            )

    sections: dict[str | None, dict[str, Any]] = {}
    table = engine_args()
    for key, s in chosen.items():
        if key in table:
            sections.setdefault(table[key].section, {})[key] = s.value
    attention = {k[len(ATTENTION_PREFIX) :]: s.value for k, s in chosen.items() if k.startswith(ATTENTION_PREFIX)}
    if ab is not None:
        attention["backend"] = parsed[ATTENTION_BACKEND]

    try:
        parts = {
            f.name: field_types(EngineConfig)[f.name](**sections.get(f.name, {}))  # type: ignore[operator]
            for f in dataclasses.fields(EngineConfig)
            if dataclasses.is_dataclass(field_types(EngineConfig)[f.name]) and f.name != "attention"
        }
        parts["attention"] = AttentionConfig(**attention)
        config = EngineConfig(**parts, **sections.get(None, {}))
    except ConfigError as e:
        s = chosen.get(e.key or "")
        if s is None and e.key == ATTENTION_PREFIX + "backend":
            s = ab
        raise _located(e, s) from None
    _log_unused_options(config.attention)
    warn_unused_settings(config, _picked(config, chosen))
    return Resolved(config, chosen)


def _picked(config: EngineConfig, chosen: dict[str, Setting]) -> set[str]:
    """The chosen engine arguments the user picked: a flag or keyword, or a file's value away from the default (a
    file written by ``attnserve config`` restates every default, which the user did not pick)."""
    if not any(s.source.startswith("file ") for s in chosen.values()):
        return set(chosen)
    values, defaults = engine_arg_values(config), engine_arg_values(EngineConfig())
    return {
        key
        for key, s in chosen.items()
        if not s.source.startswith("file ") or key not in values or values[key] != defaults[key]
    }


@functools.cache
def log_unused_options_once(backend: str, names: tuple[str, ...]) -> None:
    """Warn, once per backend and set of names, that these attention_config options do not apply to it."""
    logger.warning(
        "attention_config options %s do not apply to attention backend %s and are unused", ", ".join(names), backend
    )


def _log_unused_options(attention: AttentionConfig) -> None:
    unused = attention.unused_options()
    if unused and attention.backend is not None:
        log_unused_options_once(backend_name(attention.backend), tuple(unused))


def build_engine_config(
    model: str | None = None,
    *,
    attention_backend: Any = None,
    attention_config: AttentionConfig | Mapping[str, Any] | None = None,
    **engine_kwargs: Any,
) -> EngineConfig:
    """The EngineConfig for ``LLM(model, attention_backend=..., attention_config=..., **engine_kwargs)``.

    ``engine_kwargs`` are flat engine argument names (dtype, block_size, max_model_len, device, ...).
    ``attention_config`` is an AttentionConfig or a dict (unknown keys rejected). Giving
    ``attention_backend`` and an attention_config backend that names a different backend is an error.
    Raises ConfigError naming the argument, the value and what is allowed.
    """
    return resolve(python_settings(model, attention_backend, attention_config, engine_kwargs)).config
