"""The layout's rules, read from the source (issue #26): the lab uses only what the runtime's
packages export, the runtime never reaches into the lab, and the runtime's imports draw no
circle. An arrow is any import: at the top, inside a function or under TYPE_CHECKING."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / "wyoming_pivoice"
LAB = REPO / "lab" / "pivoice_lab"

# Circles in the runtime today (none: issue #26 item 1 put the audio core's value types in the
# contract layer and cancel_echo beside the core it builds). A circle not listed fails.
KNOWN_CIRCLES: list[set[str]] = []


def modules(root: Path) -> dict[str, Path]:
    """Dotted name → file, for every module of the package at `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name or None) for each import in the module `name` at `path`, relative
    ones made absolute; `from m import x` gives (m, x), `import m` gives (m, None)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                yield node.lineno, module, alias.name


def surfaces() -> dict[str, Path]:
    """The runtime's packages (folders with an __init__), each used from outside through it."""
    return {n: p for n, p in modules(RUNTIME).items() if p.name == "__init__.py" and "." in n}


def private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def test_the_lab_uses_only_what_the_runtime_exports() -> None:
    packages = surfaces()
    wrong = []
    for name, path in modules(LAB).items():
        where = path.relative_to(REPO)
        for line, module, imported in imports(name, path):
            if module != "wyoming_pivoice" and not module.startswith("wyoming_pivoice."):
                continue
            full = f"{module}.{imported}" if imported else module
            inside = [p for p in packages if full.startswith(p + ".") or full == p]
            if private(full):
                wrong.append(f"{where}:{line}: {full} is private")
            elif inside and module not in packages:
                package = max(inside, key=len)
                wrong.append(
                    f"{where}:{line}: {full} is inside {package}: import it from the package "
                    f"(add it to {package}'s exports if it is meant for hosts)"
                )
            elif module in packages and imported is not None:
                exported = getattr(importlib.import_module(module), "__all__", [])
                if imported not in exported:
                    wrong.append(f"{where}:{line}: {module} does not export {imported}")
    assert wrong == []


def test_no_runtime_module_names_the_lab() -> None:
    """Neither an import nor a module name in a string (importlib, `python -m`): the runtime
    finds the bench through an entry point (wyoming_pivoice/__main__.py)."""
    wrong = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for name, path in modules(RUNTIME).items()
        for line, module, _ in imports(name, path)
        if module.split(".")[0] == "pivoice_lab"
    ]
    wrong += [
        str(path.relative_to(REPO))
        for path in modules(RUNTIME).values()
        if "pivoice_lab" in path.read_text()
    ]
    assert wrong == []


@pytest.mark.parametrize("package", sorted(surfaces()))
def test_a_surface_exports_what_it_types_and_each_name_resolves(package: str) -> None:
    """A package's `_EXPORTS` (run time) and its TYPE_CHECKING imports (the type checker) are
    the same names from the same modules, and each one is there."""
    path = surfaces()[package]
    mod = importlib.import_module(package)
    exports = getattr(mod, "_EXPORTS", None)
    if exports is None:
        assert not hasattr(mod, "__all__"), f"{package}: __all__ without _EXPORTS"
        return
    typed: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.level == 1, ast.unparse(stmt)
                typed.setdefault(f".{stmt.module}", set()).update(a.name for a in stmt.names)
    assert typed == {module: set(names) for module, names in exports.items()}
    assert sorted(mod.__all__) == sorted(n for names in exports.values() for n in names)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{package}.{name}"


def test_importing_the_surfaces_loads_no_implementation() -> None:
    """The surfaces are lazy: a satellite module runs the satellite's __init__, an engine
    module the engines' (and a satellite imports engines.vad)."""
    code = (
        "import sys, wyoming_pivoice.engines, wyoming_pivoice.satellite, wyoming_pivoice.server\n"
        "print(sorted(m for m in sys.modules if m.startswith('wyoming_pivoice') "
        "or m in ('numpy', 'faster_whisper', 'llama_cpp', 'piper')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert eval(out) == [
        "wyoming_pivoice",
        "wyoming_pivoice.engines",
        "wyoming_pivoice.exports",
        "wyoming_pivoice.satellite",
        "wyoming_pivoice.server",
    ]


def circles(root: Path) -> list[set[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    mods = modules(root)
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = set()
        for _, module, imported in imports(name, path):
            full = f"{module}.{imported}" if imported else module
            target = full if full in mods else module
            if target in mods and target != name:
                targets.add(target)
        edges[name] = targets
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_runtime_draws_no_new_import_circle() -> None:
    new = [sorted(c) for c in circles(RUNTIME) if c not in KNOWN_CIRCLES]
    assert new == []


def test_the_runtime_has_no_import_circle() -> None:
    assert [sorted(c) for c in circles(RUNTIME)] == []


def test_the_lab_draws_no_import_circle() -> None:
    assert [sorted(c) for c in circles(LAB)] == []


FRONTS = ("wyoming_pivoice.satellite.standalone", "wyoming_pivoice.satellite.ha")
# What may name a front: the command that picks the mode, and the surface hosts import from.
FRONT_USERS = ("wyoming_pivoice.satellite.cli", "wyoming_pivoice.satellite")


def test_the_fronts_import_the_core_and_never_each_other() -> None:
    """satellite/standalone and satellite/ha build on the shared core (listener, turn_policy,
    turns, assemble, stages); the core names neither front, and neither front the other."""

    def front(module: str) -> str | None:
        return next((f for f in FRONTS if module == f or module.startswith(f + ".")), None)

    wrong = []
    for name, path in modules(RUNTIME).items():
        if name in FRONT_USERS:
            continue
        for line, module, imported in imports(name, path):
            full = f"{module}.{imported}" if imported else module
            target = front(full) or front(module)
            if target is not None and target != front(name):
                wrong.append(f"{path.relative_to(REPO)}:{line}: {full}")
    assert wrong == []


def test_no_wait_is_bounded_by_wait_for() -> None:
    """Python 3.11 (Raspberry Pi OS bookworm) is supported, where `asyncio.wait_for` can
    return a result and swallow the cancel that came with it: a barge-in's cancelled run
    then played on (CI, session 24). Bounds are `realtime.timeout`; a wyoming client bounds
    its connect and reads with wait_for, so each is made with no timeouts and bounded by us."""
    found = []
    for name, path in modules(RUNTIME).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            call = ast.unparse(node.func)
            timeouts = {k.arg: ast.unparse(k.value) for k in node.keywords}
            client_waits = any(
                timeouts.get(k) != "None" for k in ("connect_timeout", "read_timeout")
            )
            if call == "asyncio.wait_for" or (
                call.endswith("AsyncClient.from_uri") and client_waits
            ):
                found.append(f"{name}:{node.lineno} {call}")
    assert not found
