"""The engine-argument table: every flat engine-argument name (``block_size``, ``max_model_len``, ...) and where its
value lives in EngineConfig, derived once from the dataclass fields of EngineConfig's sub-configs, so a new field
is a new flag, config-file key and ``LLM`` keyword at once. ``engine_args.py`` resolves settings against it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from attnserve.config.attention import AttentionConfig
from attnserve.config.engine import EngineConfig
from attnserve.config.fields import allowed_values, field_docs, field_types

ATTENTION_BACKEND = "attention_backend"
ATTENTION_CONFIG = "attention_config"
ATTENTION_PREFIX = ATTENTION_CONFIG + "."


@dataclass(frozen=True)
class EngineArg:
    """One flat engine argument: where its value lives in EngineConfig and how it is declared."""

    name: str
    """Flat name, e.g. ``block_size`` (the flag is ``--block-size``)."""
    section: str | None
    """The EngineConfig field holding it (``cache``), or None for EngineConfig's own fields."""
    owner: type
    """The dataclass declaring the field."""

    @property
    def field(self) -> dataclasses.Field:
        return self.owner.__dataclass_fields__[self.name]  # type: ignore[attr-defined]

    @property
    def type(self) -> object:
        return field_types(self.owner)[self.name]

    @property
    def default(self) -> Any:
        return self.field.default

    @property
    def doc(self) -> str:
        return field_docs(self.owner).get(self.name, self.name)

    @property
    def allowed(self) -> str:
        return allowed_values(self.owner, self.name)

    @property
    def aliases(self) -> tuple[str, ...]:
        """vLLM's other names of it (``num_gpu_blocks_override``), taken as flags, file keys and keywords."""
        return tuple(self.field.metadata.get("aliases", ()))

    @property
    def short(self) -> str | None:
        """vLLM's short flag of it (``-tp``), the command line's only: a file or keyword takes the name."""
        return self.field.metadata.get("short")

    @property
    def human_readable(self) -> bool:
        """Whether the command line and config files take it with vLLM's suffixes (``32k``, ``8G``)."""
        return bool(self.field.metadata.get("human_readable"))


@functools.cache
def engine_args() -> dict[str, EngineArg]:
    """Flat name -> EngineArg for every field of EngineConfig and its sub-configs except attention.

    The attention config is reached through ``attention_backend`` and ``attention_config`` instead.
    """
    table: dict[str, EngineArg] = {}
    for f in dataclasses.fields(EngineConfig):
        tp = field_types(EngineConfig)[f.name]
        if tp is AttentionConfig:
            continue
        members = (
            [(sf.name, f.name, tp) for sf in dataclasses.fields(tp)]
            if dataclasses.is_dataclass(tp)
            else [(f.name, None, EngineConfig)]
        )
        for name, section, owner in members:
            assert name not in table, f"engine argument {name} declared twice"  # flat names must be unique
            table[name] = EngineArg(name, section, owner)  # type: ignore[arg-type]
    return table


@functools.cache
def engine_arg_aliases() -> dict[str, str]:
    """vLLM's spelling -> our flat name, e.g. ``kv_cache_memory_bytes`` -> ``kv_cache_memory``."""
    return {alias: arg.name for arg in engine_args().values() for alias in arg.aliases}


def engine_arg_names() -> list[str]:
    """Every key a config file or ``LLM(...)`` accepts, each of vLLM's other spellings right after our name
    (``num_gpu_blocks, num_gpu_blocks_override``): the valid keys of an unknown-key error, and the names its
    suggestion is chosen from."""
    return [
        *(n for arg in engine_args().values() for n in (arg.name, *arg.aliases)),
        ATTENTION_BACKEND,
        ATTENTION_CONFIG,
    ]
