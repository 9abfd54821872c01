"""The imports each install of relay-integrations promises; run by scripts/check_extras.sh.

    python scripts/check_extras.py core|langchain|llama-index|dev

Run in the venv of that install (the fresh ones hold the wheel, not the working tree):

- every install: the core modules (everything outside langchain/, llama_index/, server/ and
  the scripted vLLM of testing/) import, and load neither framework nor an optional extra;
- ``core``: neither framework is installed, and each adapter, the server, ``relaygen serve``
  and ``relaygen bench`` say which extra to install;
- ``langchain``: ``relay_integrations.langchain`` imports, LlamaIndex is not installed;
- ``llama-index``: the reverse;
- ``dev`` (the project venv, everything installed): both adapters and the server import.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ADAPTERS = {
    "langchain": ("relay_integrations.langchain", "langchain_core"),
    "llama-index": ("relay_integrations.llama_index", "llama_index"),
    "server": ("relay_integrations.server", "starlette"),
}
"""extra: (the subpackage that needs it, a top-level module it installs)."""

SERVER_MODULES = ("relay_integrations.testing.scripted_vllm",)
"""Modules outside ``server/`` that need the server extra too (the scripted vLLM serves HTTP)."""

OPTIONAL = (
    *("langchain", "langchain_core", "llama_index", "starlette", "uvicorn", "prometheus_client"),
    *("math_verify", "sympy", "matplotlib", "jinja2"),
)
"""Top-level modules of the extras, which importing the core must not load."""

ENDPOINTS = ["--large-url", "http://127.0.0.1:9/v1", "--large-model", "large"]
ENDPOINTS += ["--small-url", "http://127.0.0.1:9/v1", "--small-model", "small"]


def main(install: str) -> None:
    import relay_integrations

    package = Path(relay_integrations.__file__).parent
    if install != "dev" and not package.is_relative_to(sys.prefix):
        fail(f"relay_integrations comes from {package}, not from this venv's wheel")
    core_imports(package)
    if install == "core":
        for extra in ADAPTERS:
            missing_extra(extra)
        cli_messages()
    elif install in ("langchain", "llama-index"):
        importlib.import_module(ADAPTERS[install][0])
        for extra in ADAPTERS.keys() - {install}:
            missing_extra(extra)
    elif install == "dev":
        for module in (*(m for m, _ in ADAPTERS.values()), *SERVER_MODULES):
            importlib.import_module(module)
    else:
        fail(f"unknown install {install!r}")
    print(f"[extras] {install}: ok")


def core_imports(package: Path) -> None:
    """Import every module outside the adapters and the server; none loads an extra."""
    skip = {"langchain", "llama_index", "server"}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[1] in skip or parts[-1] == "__main__" or ".".join(parts) in SERVER_MODULES:
            continue
        importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    loaded = sorted(name for name in OPTIONAL if name in sys.modules)
    if loaded:
        fail(f"importing the core loaded {', '.join(loaded)}")


def missing_extra(extra: str) -> None:
    """The extra is not installed, and importing its subpackage says how to install it."""
    module, provided = ADAPTERS[extra]
    if importlib.util.find_spec(provided) is not None:
        fail(f"{provided} is installed without the {extra} extra")
    for needing in (module, *(SERVER_MODULES if extra == "server" else ())):
        try:
            importlib.import_module(needing)
        except ImportError as error:
            expect(str(error), f"pip install 'relay-integrations[{extra}]'", f"import {needing}")
        else:
            fail(f"{needing} imported without {provided}")


def cli_messages() -> None:
    """``relaygen serve`` and ``relaygen bench`` without their extras: exit 2, and what to do."""
    from relay_integrations.cli import main as relaygen

    with tempfile.TemporaryDirectory() as tmp:
        problems = Path(tmp, "problems.jsonl")
        problems.write_text('{"problem": "1 + 1?", "answer": "2"}\n', encoding="utf-8")
        bench = ["bench", "--problems", str(problems), "--out", tmp, *ENDPOINTS]
        for extra, argv in (("server", ["serve", *ENDPOINTS]), ("bench", bench)):
            code, stderr = captured(relaygen, argv)
            if code != 2:
                fail(f"relaygen {argv[0]} without [{extra}]: exit {code}, not 2 ({stderr!r})")
            expect(stderr, f"pip install 'relay-integrations[{extra}]'", f"relaygen {argv[0]}")


def captured(run: Callable[[list[str]], int], argv: list[str]) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = run(argv)
    return code, stderr.getvalue()


def expect(text: str, needed: str, what: str) -> None:
    if needed not in text:
        fail(f"{what}: the message does not say {needed!r}: {text!r}")


def fail(message: str) -> None:
    print(f"[extras] FAILED: {message}", file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
