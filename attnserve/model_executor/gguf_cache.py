"""An on-disk cache of the transformers config and tokenizer converted from a GGUF file.

transformers builds both from the GGUF's metadata, and each ``from_pretrained(..., gguf_file=...)`` parses
the whole file's metadata with ``gguf.GGUFReader`` (~3-4 s for the default model, mostly its 49k-token
tokenizer arrays). The first load saves each converted object with ``save_pretrained``; later loads of the
same file read those files instead (a fraction of a second).

Layout: ``<root>/gguf/<key>/<part>/`` with ``part`` ``config`` or ``tokenizer``; ``root`` is
``$ATTNSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnserve``, else ``~/.cache/attnserve``. ``key`` hashes
the GGUF's absolute path, size and mtime (a rewritten file misses) and the transformers version (a newer one
may convert differently). A part is written into a temporary folder beside it and renamed into place, so
a reader sees it whole or not at all; when a concurrent writer renames first, its copy stays. The cache never
fails a load: an error reading or writing it falls back to converting from the GGUF, with one log line; a
cached config whose shapes do not fit the weights makes the engine delete the entry (``cached_entry``) and
convert again once, with one warning naming the folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import TypeVar

CACHE_DIR_ENV = "ATTNSERVE_CACHE_DIR"

T = TypeVar("T")
logger = logging.getLogger(__name__)


def cache_root(environ: Mapping[str, str] = os.environ) -> str:
    """attnserve's cache folder: ``$ATTNSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnserve``, else
    ``~/.cache/attnserve``."""
    if environ.get(CACHE_DIR_ENV):
        return os.path.expanduser(environ[CACHE_DIR_ENV])
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "attnserve")


def entry_key(gguf_path: str) -> str:
    """Hash of the GGUF's absolute path, size, mtime_ns and the transformers version. Raises OSError when
    the file cannot be stat'ed."""
    import transformers

    path = os.path.abspath(gguf_path)
    st = os.stat(path)
    ident = "\0".join((path, str(st.st_size), str(st.st_mtime_ns), transformers.__version__))
    return hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def part_folder(gguf_path: str, part: str, root: str) -> str:
    """Where ``part`` (``config`` or ``tokenizer``) of ``gguf_path`` is cached under ``root``."""
    return os.path.join(root, "gguf", entry_key(gguf_path), part)


def cached_gguf_part(gguf_path: str, part: str, convert: Callable[[], T], load: Callable[[str], T], root: str) -> T:
    """``part`` of ``gguf_path``: ``load(folder)`` from the cache under ``root`` on a hit; else ``convert()``
    (the parse of the GGUF), whose result's ``save_pretrained`` then fills the cache.

    Errors of the cache itself (no folder, a damaged copy, a failed write) are logged and fall back to
    ``convert()``'s object; errors of ``convert()`` propagate as without a cache.
    """
    try:
        folder = part_folder(gguf_path, part, root)
    except OSError as e:
        logger.info("GGUF %s cache not used for %s: %s", part, gguf_path, e)
        return convert()
    if os.path.isdir(folder):
        try:
            return load(folder)
        except Exception as e:  # a damaged or half-deleted copy, whatever transformers raises for it
            logger.info("GGUF %s cache %s unreadable (%s); converting %s again", part, folder, e, gguf_path)
            return convert()
    obj = convert()
    _save(obj, folder, part)
    return obj


def _save(obj, folder: str, part: str) -> None:
    """``obj.save_pretrained`` into ``folder`` atomically: a temporary sibling folder, then a rename.
    Never raises: a failed write only logs (the converted object is fine)."""
    parent = os.path.dirname(folder)
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{part}-", dir=parent)
        obj.save_pretrained(tmp)
        try:
            os.rename(tmp, folder)
            tmp = None
        except OSError:
            if not os.path.isdir(folder):
                raise
            # a concurrent writer renamed its copy first: keep it, drop ours
    except Exception as e:  # OSError mostly (read-only, full disk); any other only loses the cache
        logger.info("GGUF %s cache not written to %s: %s", part, folder, e)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def cached_entry(gguf_path: str, root: str) -> str | None:
    """The cache folder of ``gguf_path`` (``<root>/gguf/<key>``, all its parts) when it exists, else None."""
    try:
        folder = os.path.dirname(part_folder(gguf_path, "config", root))
    except OSError:
        return None
    return folder if os.path.isdir(folder) else None
