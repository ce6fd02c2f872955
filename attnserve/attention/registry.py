"""AttentionBackendEnum: backend names mapped to lazily imported class paths (design §2).

Importing this module imports no kernel library: a class path is imported only when a backend is used.

* ``register_backend(AttentionBackendEnum.FLASH_ATTN, "pkg.mod.MyBackend")`` overrides a member;
  ``register_backend("MY_ATTN", "pkg.mod.MyBackend")`` adds a backend under a new name (explicit selection
  only: it is in no platform's priority list); ``CUSTOM`` must be registered before use.
* As a class decorator: ``@register_backend(AttentionBackendEnum.CUSTOM)`` above ``class MyBackend``.
* Out-of-tree packages declare entry points in the group ``attnserve.attention_backends``:
  ``MY_ATTN = "pkg.mod:MyBackend"`` (a member name overrides that member). They are read, not imported,
  on the first registry lookup.

Every registration clears the selector's cache, so a new registration is seen by the next selection.
"""

from __future__ import annotations

import difflib
import enum
import importlib
from collections.abc import Callable
from typing import Any

from attnserve.refusals import Refusal, Refused
from attnserve.refusals import backends as words

ENTRY_POINT_GROUP = "attnserve.attention_backends"


class AttentionBackendEnum(enum.Enum):
    """The attention backends users name with ``--attention-backend`` (vLLM's enum names)."""

    FLASH_ATTN = "attnserve.attention.backends.flash_attn.FlashAttentionBackend"
    FLASHINFER = "attnserve.attention.backends.flashinfer.FlashInferBackend"
    TRITON_ATTN = "attnserve.attention.backends.triton_attn.TritonAttentionBackend"
    FLEX_ATTENTION = "attnserve.attention.backends.flex_attention.FlexAttentionBackend"
    CPU_ATTN = "attnserve.attention.backends.cpu_attn.CPUAttentionBackend"
    CUSTOM = ""

    def get_path(self) -> str:
        """The class path this member resolves to (an override if one is registered)."""
        return class_path(self)

    def get_class(self) -> type:
        """Import and return the backend class (ImportError when its module is missing)."""
        return get_backend_class(self)

    def is_overridden(self) -> bool:
        _load_entry_points()
        return self.name in _PATHS or self.name in _CLASSES


# A backend is named by an enum member or, for out-of-tree additions, by its registered name.
BackendName = AttentionBackendEnum | str


class UnknownBackendError(Refused):
    """A backend name that is neither an enum member nor registered; the record's ``allowed`` lists the valid ones."""


_PATHS: dict[str, str] = {}  # name -> "pkg.module.Class" registered or from entry points
_CLASSES: dict[str, type] = {}  # name -> class registered directly (decorator, or a class object)
_ON_CHANGE: list[Callable[[], None]] = []  # cache-clearing hooks (the selector adds one)
_entry_points_loaded = False


def _name(backend: BackendName) -> str:
    return backend.name if isinstance(backend, AttentionBackendEnum) else str(backend).strip().upper().replace("-", "_")


def on_registry_change(callback: Callable[[], None]) -> None:
    """Call ``callback`` after every registration (the selector clears its cache this way)."""
    _ON_CHANGE.append(callback)


def _changed() -> None:
    for callback in _ON_CHANGE:
        callback()


def _normalize_path(path: str) -> str:
    # entry points write "pkg.module:Class"; we store "pkg.module.Class"
    return path.replace(":", ".")


def register_backend(backend: BackendName, class_path_or_cls: "str | type | None" = None) -> Any:
    """Override ``backend`` (a member) or add a backend under a new name.

    ``register_backend(member_or_name, "pkg.module.Class")`` or ``register_backend(member_or_name, Class)``
    registers at once; ``register_backend(member_or_name)`` returns a class decorator. New names are
    upper-cased. Raises ValueError on an empty name.
    """
    name = _name(backend)
    if not name:
        raise ValueError(words.NEEDS_A_NAME)

    def _register(target: "str | type") -> "str | type":
        if isinstance(target, str):
            _CLASSES.pop(name, None)
            _PATHS[name] = _normalize_path(target)
        else:
            _PATHS.pop(name, None)
            _CLASSES[name] = target
        _changed()
        return target

    if class_path_or_cls is None:
        return _register  # used as @register_backend(...)
    return _register(class_path_or_cls)


def unregister_backend(backend: BackendName) -> None:
    """Drop a registration (a member goes back to its built-in path). Mostly for tests."""
    name = _name(backend)
    _PATHS.pop(name, None)
    _CLASSES.pop(name, None)
    _changed()


def _load_entry_points() -> None:
    """Read the ``attnserve.attention_backends`` entry points once (their modules are not imported)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        name = ep.name.upper()
        if name not in _PATHS and name not in _CLASSES:  # an explicit register_backend call wins
            _PATHS[name] = _normalize_path(ep.value)
    _changed()


def class_path(backend: BackendName) -> str:
    """The class path ``backend`` resolves to; "" for an unregistered CUSTOM."""
    _load_entry_points()
    name = _name(backend)
    if name in _CLASSES:
        cls = _CLASSES[name]
        return f"{cls.__module__}.{cls.__qualname__}"
    if name in _PATHS:
        return _PATHS[name]
    if name in AttentionBackendEnum.__members__:
        return AttentionBackendEnum[name].value
    raise UnknownBackendError(_unknown(name))


def get_backend_class(backend: BackendName) -> type:
    """Import and return the class of ``backend``.

    Raises ImportError when its module is missing, ValueError when ``CUSTOM`` is not registered and
    UnknownBackendError for an unknown name.
    """
    _load_entry_points()
    name = _name(backend)
    if name in _CLASSES:
        return _CLASSES[name]
    path = class_path(backend)
    if not path:
        raise ValueError(words.no_class_registered(name))
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except AttributeError:
        raise ImportError(words.module_lacks(module, attr)) from None


def registered_names() -> list[str]:
    """Every selectable backend name: the enum members (CUSTOM only when registered), then additions."""
    _load_entry_points()
    names = [m.name for m in AttentionBackendEnum if m is not AttentionBackendEnum.CUSTOM or m.is_overridden()]
    extra = sorted((set(_PATHS) | set(_CLASSES)) - set(AttentionBackendEnum.__members__))
    return names + extra


def lookup_backend(name: "str | AttentionBackendEnum | None") -> BackendName | None:
    """Parse a backend name case-insensitively ("-" = "_"); None, "" and "auto" mean automatic.

    Returns the enum member, or the registered name of an out-of-tree backend. Raises UnknownBackendError
    listing the valid names and the closest one.
    """
    if name is None or isinstance(name, AttentionBackendEnum):
        return name
    key = name.strip().upper().replace("-", "_")
    if key in ("", "AUTO"):
        return None
    if key in AttentionBackendEnum.__members__:
        return AttentionBackendEnum[key]
    _load_entry_points()
    if key in _PATHS or key in _CLASSES:
        return key
    raise UnknownBackendError(_unknown(key, original=name))


def suggest_backend_name(name: str, valid: list[str]) -> str | None:
    """The valid name closest to ``name``. "ATTENTION" and "ATTN" count as the same word, so that
    ``FLASH_ATTENTION`` suggests FLASH_ATTN (plain difflib would say FLEX_ATTENTION)."""

    def norm(text: str) -> str:
        return text.upper().replace("-", "_").replace("ATTENTION", "ATTN")

    by_norm = {norm(v): v for v in valid}
    if norm(name) in by_norm:
        return by_norm[norm(name)]
    match = difflib.get_close_matches(norm(name), list(by_norm), n=1)
    return by_norm[match[0]] if match else None


def _unknown(key: str, original: str | None = None) -> Refusal:
    valid = registered_names()
    return words.unknown_backend(original or key, valid, suggest_backend_name(key, valid))


def backend_name(backend: BackendName) -> str:
    """The display name of ``backend`` (the member's name or the registered name)."""
    return _name(backend)
