"""Which way imports run between attnserve's packages (the design notes' "Which way imports run"):

    entrypoints -> engine -> executor -> model_executor -> models -> layers, attention -> kernels
                                         model_executor -> gemv -> layers, kernels
                                                                     -> platforms, config -> refusals
    engine, executor, model_executor -> core (the records they share) -> config, refusals

Every ``import`` of an attnserve module (at module level, inside a function or under ``TYPE_CHECKING``:
each is a dependency of the design) must follow :data:`DIRECT` or its transitive closure, apart from the
named modules of :data:`ALLOWED_MODULES`. ``kernels/`` is a leaf: it imports nothing of attnserve but ``platforms``. ``layers/`` and
``attention/`` never import each other. The imports are read with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "attnserve"

# package -> the packages it imports directly; the allowed directions are this relation's transitive closure
DIRECT: dict[str, set[str]] = {
    "entrypoints": {"benchmarks", "engine"},
    "benchmarks": {"engine"},  # offline throughput/latency runs drive an LLMEngine
    "engine": {"executor", "core", "structured_output"},
    "executor": {"model_executor", "core"},
    "model_executor": {"models", "core", "structured_output", "gemv"},
    "gemv": {"layers", "kernels"},  # the skinny-GEMM plan: measured kernels installed as the layers' methods
    # grammar matchers and the bitmask (host: the engine; device: the runner, its Triton kernel)
    "structured_output": {"core", "kernels"},
    "core": {"config", "refusals"},  # a step's plan and SamplingParams: what the engine and the runner share
    "models": {"layers", "attention"},
    "layers": {"kernels", "distributed"},
    "attention": {"kernels", "config"},
    "kernels": {"platforms"},
    "distributed": {"platforms"},  # the tensor-parallel group record and split arithmetic
    "platforms": {"config"},
    "config": {"refusals"},
    "refusals": set(),  # the refusal record and its formatters: every package raises with it
}

# modules a package may import although their package lies above it
ALLOWED_MODULES: dict[str, set[str]] = {
    "entrypoints": {"attnserve"},  # the package's public names (LLM, __version__)
    "config": {"attnserve.attention.registry"},  # the registry's enum names (no attnserve imports of its own)
    "platforms": {"attnserve.attention.registry"},  # the backend priority lists name its enum members
}


def _closure() -> dict[str, set[str]]:
    allowed = {}
    for pkg in DIRECT:
        seen, todo = set(), list(DIRECT[pkg])
        while todo:
            dep = todo.pop()
            if dep not in seen:
                seen.add(dep)
                todo.extend(DIRECT[dep])
        allowed[pkg] = seen
    return allowed


ALLOWED = _closure()


def _imported_modules(path: Path) -> set[str]:
    """The attnserve modules ``path`` imports: ``from a.b import c`` counts as ``a.b.c`` when that is a module
    (or package) of attnserve, else as ``a.b``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "attnserve")
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            if node.module and node.module.split(".")[0] == "attnserve":
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    out.add(sub if _is_module(sub) else node.module)
    return out


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


@cache
def _edges() -> list[tuple[str, str, str, str]]:
    """(importing file relative to attnserve/, its package, imported module, that module's package) for every
    import across two packages."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) == 1:  # attnserve/__init__.py, __main__.py: the public names and the CLI
            continue
        src = rel.parts[0]
        for module in _imported_modules(path):
            parts = module.split(".")
            dst = parts[1] if len(parts) > 1 else ""
            if dst != src:
                edges.append((rel.as_posix(), src, module, dst))
    return edges


def test_every_package_is_in_the_table():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(DIRECT), "add the package to DIRECT (and to the design notes' import directions)"


def test_the_allowed_directions_have_no_cycle():
    assert all(pkg not in ALLOWED[pkg] for pkg in DIRECT)


def test_imports_run_in_the_allowed_directions():
    wrong = [
        f"{file} imports {module}"
        for file, src, module, dst in _edges()
        if dst not in ALLOWED[src] and module not in ALLOWED_MODULES.get(src, set())
    ]
    assert not wrong, "imports against the direction of the package layers:\n" + "\n".join(wrong)


@pytest.mark.parametrize("pkg", ["kernels", "layers", "attention"])
def test_kernels_is_a_leaf_and_layers_and_attention_do_not_import_each_other(pkg):
    others = {"kernels": set(DIRECT) - {"kernels", "platforms"}, "layers": {"attention"}, "attention": {"layers"}}
    bad = [f"{file} imports {module}" for file, src, module, dst in _edges() if src == pkg and dst in others[pkg]]
    assert not bad, bad


def test_layers_and_attention_import_only_public_names_of_kernels():
    bad = []
    for path in [*(PACKAGE / "layers").rglob("*.py"), *(PACKAGE / "attention").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnserve.kernels"):
                bad += [
                    f"{path.relative_to(PACKAGE)}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")
                ]
    assert not bad, bad
