"""Every ``:mod:`` reference in the package's docstrings names a module that exists (a module
that moves or is renamed takes its references along)."""

from __future__ import annotations

import re
from pathlib import Path

import relay_integrations

PACKAGE = Path(relay_integrations.__file__).parent
_REFERENCE = re.compile(r":mod:`~?([.\w]+)`")


def _exists(name: str, package: Path) -> bool:
    if name.startswith("relay_integrations"):
        base, parts = PACKAGE.parent, name.split(".")
    else:
        dots = len(name) - len(name.lstrip("."))
        base = package
        for _ in range(dots - 1):
            base = base.parent
        parts = name.lstrip(".").split(".")
    path = base.joinpath(*parts)
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_every_module_reference_resolves() -> None:
    broken = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in PACKAGE.rglob("*.py")
        for name in _REFERENCE.findall(path.read_text())
        if not _exists(name, path.parent)
    ]
    assert not broken, "\n".join(broken)
