"""The package's layering, read statically: no import cycles (function-local imports included),
lower layers never import upper ones, and the router stays pure Python."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mlxswitch"

# Bottom to top. A module may import its own layer or lower ones, never a higher one.
LAYERS = [
    ("mlxswitch", "mlxswitch.errors", "mlxswitch.resources", "mlxswitch.files", "mlxswitch.toml_text"),
    (
        "mlxswitch.routing.router",
        "mlxswitch.decoding.mode",  # a setting beside the router's, read by the profiles
        "mlxswitch.routing.policies",
        "mlxswitch.routing",
        "mlxswitch.kernels",
        "mlxswitch.cloud",
        "mlxswitch.bench.metrics",
        "mlxswitch.bench.prompts",
    ),
    ("mlxswitch.routing.signals", "mlxswitch.routing.probe", "mlxswitch.models"),
    ("mlxswitch.profiles", "mlxswitch.profile_load", "mlxswitch.profile_edit"),
    ("mlxswitch.decoding",),
    ("mlxswitch.api", "mlxswitch.checks", "mlxswitch.bench", "mlxswitch.draft_store"),
    ("mlxswitch.server",),  # the HTTP server: just below the CLI, which starts it
    ("mlxswitch.cli", "mlxswitch.__main__"),
]
PURE = (
    "mlxswitch.routing.router",
    "mlxswitch.decoding.mode",
    "mlxswitch.routing.policies",
    "mlxswitch.routing.walk",
    "mlxswitch.routing.registry",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module this file imports, anywhere in it (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names} & set(known)
            found.update(submodules)  # `from . import ui` imports the submodule ui
            if len(submodules) < len(node.names):  # a name defined in the module itself
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _layer(name: str) -> int:
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            inside = name == prefix or name.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[0]


def test_no_import_cycles(graph):
    internal = {a: {b for b in bs if b in graph and b != a} for a, bs in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(internal[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
                pytest.fail("import cycle: " + " → ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(internal):
        if start not in state:
            visit(start, [start])


def test_lower_layers_never_import_upper_ones(graph):
    # A package's __init__ may re-export its own modules (mlxswitch.cli → mlxswitch.cli.app).
    upward = [
        f"{a} → {b}"
        for a, bs in graph.items()
        for b in bs
        if b in graph and _layer(b) > _layer(a) and not b.startswith(a + ".")
    ]
    assert upward == []


def test_the_router_imports_neither_mlx_nor_numpy(graph):
    seen, todo = set(), list(PURE)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for target in graph.get(name, ()):
            top = target.split(".")[0]
            assert top not in ("mlx", "mlx_lm", "numpy"), f"{name} imports {target}"
            if target in graph:
                todo.append(target)


def test_the_check_sees_function_local_imports():
    # Guards the checks above against vacuity: a local import inside a function is found.
    known = _modules()
    found = _imports("mlxswitch.cli.cmd_chat", known["mlxswitch.cli.cmd_chat"], known)
    assert "mlxswitch.api" in found and "mlxswitch.cli.ui" in found


def test_the_token_path_in_the_architecture_page_points_at_the_code():
    """docs/architecture.md's "A token's path today": every `file:line` exists, and where a call
    is named beside it (`file:line` `name(…)`), that line holds it."""
    import re

    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("**A token's path today**") : text.index("The steps in detail:")]
    package = root / "mlxswitch"
    found = 0
    reference = r"`((?:\w+/)*\w+\.(?:py|c)):(\d+)`(?:\s+`([\w. ]+?)(?:\([^`]*\))?`)?"
    for path, line, name in re.findall(reference, section):
        candidates = [package / path] if (package / path).exists() else list(package.rglob(Path(path).name))
        assert len(candidates) == 1, f"{path} names no single file under mlxswitch/"
        lines = candidates[0].read_text(encoding="utf-8").splitlines()
        number = int(line)
        assert number <= len(lines) and lines[number - 1].strip(), f"{path}:{line} is past the end or blank"
        assert name, f"{path}:{line} names nothing to check beside it"
        assert name.split(".")[-1] in lines[number - 1], f"{path}:{line} no longer holds {name}"
        found += 1
    assert found >= 10
