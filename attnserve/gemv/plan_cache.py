"""The measured GEMV plan on disk: a second start with the same GPU, software, dtype, shapes and code loads it.

A plan's file is ``<root>/gemv/<key>.json`` (``root``: attnserve's cache folder, which the model runner
passes: ``$ATTNSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnserve``, else ``~/.cache/attnserve``). ``key`` is
the sha256 of a canonical JSON of everything the choices depend on (:func:`key_inputs`): the GPU's name,
compute capability and SM count, the torch, Triton and CUDA versions, the dtype, the (kind, N, K) shapes
measured (``plan.plan_shapes``), the row counts, the margins, whether the Triton kernels launch with PDL,
and :func:`code_version` (the source of the files that time and decide). The file holds those inputs and the
choices (``plan_json``); it is written to a temporary file beside it and renamed into place, so a reader
sees it whole or not at all. A file that cannot be read or parsed is ignored with a warning and the plan
measured again (and the file rewritten); a cache folder that cannot be written costs one warning.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from torch import nn

from attnserve.gemv import choices
from attnserve.gemv.plan import GemvPlan, gemv_layers, plan_shapes
from attnserve.gemv.plan_json import plan_from_dict, plan_to_dict

logger = logging.getLogger("attnserve.gemv")

_PACKAGE = Path(__file__).resolve().parents[1]  # attnserve/
# the kernels the plan times or installs, besides gemv/*.py: the GEMV, its configurations, the greedy head, the
# argmax and SwiGLU it is timed against, and what they share (launch options, PDL)
KERNEL_FILES = (
    "kernels/triton_gemv.py",
    "kernels/triton_gemv_config.py",
    "kernels/triton_greedy_head.py",
    "kernels/triton_argmax.py",
    "kernels/fused_ops.py",
    "kernels/triton_fused_ops.py",
    "kernels/triton_common.py",
    "kernels/pdl.py",
)


def code_files() -> list[Path]:
    """The source files whose text :func:`code_version` hashes: ``gemv/*.py`` and :data:`KERNEL_FILES`."""
    return sorted(_PACKAGE.glob("gemv/*.py")) + [_PACKAGE / f for f in KERNEL_FILES]


def source_hash(paths: list[Path], base: Path) -> str:
    """sha256 (hex) of each of ``paths`` in turn: its path relative to ``base`` and its bytes."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.relative_to(base).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def code_version() -> str:
    """:func:`source_hash` of :func:`code_files`: the code that times, decides and installs a plan."""
    return source_hash(code_files(), _PACKAGE)


def key_inputs(
    *,
    gpu_name: str,
    capability: tuple[int, int],
    sm_count: int,
    torch_version: str,
    triton_version: str,
    cuda_version: str | None,
    dtype: str,
    shapes: list[tuple[str, int, int]],
    rows: tuple[int, ...],
    pdl: bool,
    code: str,
    margin: float | None = None,
    lt_margin: float | None = None,
) -> dict[str, Any]:
    """Everything a plan's choices depend on, JSON-ready; ``margin`` / ``lt_margin`` default to
    ``choices.MARGIN`` / ``choices.LT_MARGIN`` as they are now."""
    return {
        "gpu": {"name": gpu_name, "capability": list(capability), "sm_count": sm_count},
        "versions": {"torch": torch_version, "triton": triton_version, "cuda": cuda_version},
        "dtype": dtype,
        "shapes": [list(s) for s in shapes],
        "rows": list(rows),
        "margins": [
            choices.MARGIN if margin is None else margin,
            choices.LT_MARGIN if lt_margin is None else lt_margin,
        ],
        "pdl": pdl,
        "code": code,
    }


def model_key_inputs(model: nn.Module, rows: tuple[int, ...]) -> dict[str, Any]:
    """:func:`key_inputs` for ``model`` (on its CUDA device) at the row counts ``rows``."""
    import torch
    import triton

    from attnserve.kernels import pdl

    weight = gemv_layers(model)[0][1]
    props = torch.cuda.get_device_properties(weight.device)
    return key_inputs(
        gpu_name=props.name,
        capability=(props.major, props.minor),
        sm_count=props.multi_processor_count,
        torch_version=torch.__version__,
        triton_version=triton.__version__,
        cuda_version=torch.version.cuda,
        dtype=str(weight.dtype).removeprefix("torch."),
        shapes=plan_shapes(model),
        rows=rows,
        pdl=pdl.enabled(),
        code=code_version(),
    )


def plan_key(inputs: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of ``inputs`` (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def plan_path(root: str | os.PathLike, key: str) -> Path:
    """Where the plan of ``key`` is cached under attnserve's cache folder ``root``."""
    return Path(root) / "gemv" / f"{key}.json"


def load_plan(path: Path) -> GemvPlan | None:
    """The plan saved at ``path`` (not installed); None when there is none, or (with a warning) when it cannot
    be read or is not a plan."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("GEMV plan cache %s unreadable (%s); measuring again", path, e)
        return None
    try:
        return plan_from_dict(json.loads(text)["plan"])
    except (ValueError, KeyError, TypeError) as e:
        logger.warning("GEMV plan cache %s is not a plan (%s); measuring again", path, e)
        return None


def save_plan(path: Path, plan: GemvPlan, inputs: dict[str, Any]) -> bool:
    """Write ``plan`` and its key ``inputs`` to ``path`` (a temporary file, then renamed); False, with a
    warning, when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"inputs": inputs, "plan": plan_to_dict(plan)}, f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        logger.warning("GEMV plan not cached: cannot write %s (%s)", path, e)
        return False
    return True


def cached_plan(
    path: Path, inputs: dict[str, Any], measure: Callable[[], GemvPlan], log: bool = True
) -> tuple[GemvPlan, bool]:
    """(the plan, whether it was loaded): the one at ``path`` when it reads, else ``measure()``'s, saved there
    with ``inputs``. Logs (``log``) one line: loaded from where, or measured in how long and saved where."""
    plan = load_plan(path)
    if plan is not None:
        if log:
            logger.info("GEMV plan loaded from %s (no timing; measuring it took %.1f s)", path, plan.seconds)
        return plan, True
    t0 = time.perf_counter()
    plan = measure()
    saved = save_plan(path, plan, inputs)
    if log:
        logger.info(
            "GEMV plan measured in %.1f s%s",
            time.perf_counter() - t0,
            f", saved to {path}" if saved else " (not saved)",
        )
    return plan, False
