"""The package's import graph: no cycle, and every arrow points down the layers.

The relay is three layers, each importing only the ones below it: ``upstream`` (the wire to
vLLM), ``relay`` (the method), ``chat`` (what both adapters share). Above them the adapters,
the server, the offline jobs and the command line. Read from the source, so an import added
inside a function counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import relay_integrations

PACKAGE = Path(relay_integrations.__file__).parent
ROOT = "relay_integrations"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"upstream"}),
    frozenset({"relay", "jobs"}),
    frozenset({"chat", "testing", ""}),  # "": the package's own __init__ (its public names)
    frozenset({"calibration", "bench", "langchain", "llama_index", "server"}),
    frozenset({"cli"}),
)
"""Bottom first. A package may import from its own layer's package only, and from any lower
layer."""


def _module_name(path: Path) -> str:
    parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str | None = None) -> Iterator[str]:
    """Every module `path` (the module `module`, by default the package's module at `path`)
    imports, anywhere in it, and every name it imports from one."""
    module = module or _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts
    }


def _known(target: str, modules: dict[str, Path]) -> str:
    """The module `target` names: itself, or the module it is a name of."""
    while target not in modules and "." in target:
        target = target.rpartition(".")[0]
    return target


def _top_package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer() -> None:
    packages = {_top_package(name) for name in _modules()}
    assert packages <= set().union(*LAYERS), packages - set().union(*LAYERS)


def test_every_arrow_points_down_the_layers() -> None:
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        own = _top_package(name)
        for target in _imports(path):
            if not target.startswith(ROOT):
                continue
            other = _top_package(_known(target, modules))
            if other == own or (own, other) == ("", ""):
                continue
            if _layer(other) >= _layer(own):
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_three_layers_import_only_downwards() -> None:
    """Spelled out for the three layers: the wire knows nothing of the method, the method
    nothing of the adapters' kit."""
    modules = _modules()
    for name, path in modules.items():
        targets = {_top_package(_known(t, modules)) for t in _imports(path) if t.startswith(ROOT)}
        if _top_package(name) == "upstream":
            assert not targets & {"relay", "chat"}, name
        if _top_package(name) == "relay":
            assert "chat" not in targets, name


def test_no_module_imports_itself_round_a_cycle() -> None:
    """No cycle among the modules, counting every import (inside functions too): each
    module can be read, and imported first, without the ones that use it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for target in _imports(path):
            parts = target.split(".")
            for end in range(2, len(parts) + 1):  # importing a.b.c imports a.b first
                prefix = ".".join(parts[:end])
                if prefix in modules and prefix != name and not name.startswith(prefix + "."):
                    edges.add(prefix)
        graph[name] = edges
    cycles = [cycle for start in sorted(graph) if (cycle := _cycle_from(start, graph))]
    assert not cycles, cycles[0]


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    path, on_path, done = [start], {start}, set()

    def visit(node: str) -> list[str] | None:
        for nxt in sorted(graph[node]):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt in done:
                continue
            path.append(nxt)
            on_path.add(nxt)
            if found := visit(nxt):
                return found
            on_path.discard(path.pop())
            done.add(nxt)
        return None

    return visit(start)


BENCHMARKS = PACKAGE.parent / "benchmarks"


def _private(module: str) -> bool:
    return any(part.startswith("_") and part != "__init__" for part in module.split(".")[1:])


def test_no_module_imports_another_packages_private_module() -> None:
    """A module whose name starts with ``_`` belongs to its package: the package's modules
    may import it, no other package's (nor the benchmarks') may."""
    modules = _modules()
    sources = dict(modules)
    for path in BENCHMARKS.rglob("*.py"):
        parts = path.relative_to(BENCHMARKS.parent).with_suffix("").parts
        sources[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    wrong = []
    for name, path in sources.items():
        own = _top_package(name) if name.startswith(ROOT) else "benchmarks"
        for target in _imports(path, name):
            if not target.startswith(ROOT + "."):
                continue
            known = _known(target, modules)
            if _private(known) and _top_package(known) != own:
                wrong.append(f"{name} imports {known}")
    assert not wrong, "\n".join(sorted(set(wrong)))
