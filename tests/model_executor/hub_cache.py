"""A Hugging Face hub cache laid out as huggingface_hub lays it out, built from a local model folder."""

from __future__ import annotations

import hashlib
import os
import shutil


def add_to_hub_cache(
    folder: str,
    cache: str,
    repo_id: str,
    ref: str | None = "main",
    files: list[str] | None = None,
    symlinks: bool = True,
) -> str:
    """Put ``folder``'s files (or only ``files``) into ``cache`` as repo ``repo_id``; returns the commit hash.

    Layout: ``models--org--name/blobs/<sha256>``, ``snapshots/<commit>/<file>`` (relative symlinks into
    ``blobs/``, or copies), and ``refs/<ref>`` holding the commit (no ref when ``ref`` is None).
    """
    names = sorted(files if files is not None else os.listdir(folder))
    storage = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    digest = hashlib.sha1()
    for name in names:
        digest.update(name.encode())
        with open(os.path.join(folder, name), "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    commit = digest.hexdigest()  # 40 hex digits, as a git commit
    snapshot = os.path.join(storage, "snapshots", commit)
    os.makedirs(snapshot, exist_ok=True)
    os.makedirs(os.path.join(storage, "blobs"), exist_ok=True)
    for name in names:
        src = os.path.join(folder, name)
        dst = os.path.join(snapshot, name)
        if not symlinks:
            shutil.copyfile(src, dst)
            continue
        with open(src, "rb") as f:
            blob = hashlib.sha256(f.read()).hexdigest()
        shutil.copyfile(src, os.path.join(storage, "blobs", blob))
        os.symlink(os.path.join("..", "..", "blobs", blob), dst)
    if ref is not None:
        os.makedirs(os.path.join(storage, "refs"), exist_ok=True)
        with open(os.path.join(storage, "refs", ref), "w") as f:
            f.write(commit)
    return commit
