"""The old home of the relay, kept so that existing imports work: they warn and name the new
path. The relay now lives in three layers:

- :mod:`relay_integrations.relay`: the method (configuration, cue sets, the switcher, results);
- :mod:`relay_integrations.upstream`: the wire to vLLM (endpoints, requests, rendering);
- :mod:`relay_integrations.chat`: what the LangChain and LlamaIndex adapters share.

::

    from relay_integrations.core import RelayConfig     # DeprecationWarning: use
    from relay_integrations.relay import RelayConfig    # relay_integrations.relay
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "artifact": ("relay.artifact",),
    "chat": ("chat.exchange",),
    "client": ("chat.client",),
    "closing": ("relay.closing",),
    "completion": ("upstream.completion",),
    "config": ("upstream.config", "relay.config"),
    "constraints": ("chat.constraints",),
    "cues": ("relay.cues",),
    "endpoint": ("upstream.endpoint",),
    "errors": ("upstream.errors", "relay.errors"),
    "final_event": ("relay.final_event",),
    "generation": ("relay._generation",),
    "habits": ("chat.habits", "upstream.reserved_fields"),
    "observer": ("upstream.observer",),
    "partial_json": ("chat._partial_json",),
    "reasoning": ("relay.reasoning",),
    "rendering": ("upstream.rendering",),
    "result": ("relay.result",),
    "sentences": ("relay.sentences",),
    "server_check": ("relay.server_check",),
    "settings": ("chat.settings",),
    "speculative_handoff": ("relay._speculative_handoff",),
    "stream_stops": ("upstream._stream_stops",),
    "switcher": ("relay.switcher",),
    "sync": ("relay._sync",),
    "tool_calls": ("chat.tool_calls",),
    "turns": ("relay._turns",),
    "upstream_errors": ("upstream._failures",),
    "warm_up": ("relay._warm_up",),
    "wire": ("upstream._http",),
}
"""Each module of the old ``relay_integrations.core`` and where its contents went."""

_PACKAGE = "relay_integrations"


def _warn(old: str, new: Sequence[str]) -> None:
    paths = " and ".join(f"{_PACKAGE}.{path}" for path in new)
    warnings.warn(f"{old} has moved: import from {paths}", DeprecationWarning, stacklevel=3)


def __getattr__(name: str) -> Any:
    """``from relay_integrations.core import X``: X from :mod:`relay_integrations.relay`."""
    relay = importlib.import_module(f"{_PACKAGE}.relay")
    if name not in relay.__all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _warn(f"{__name__}.{name}", ("relay",))
    return getattr(relay, name)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of ``relay_integrations.core.<module>``: the module's new home (or, for a module
    whose contents went to two places, a module holding both), with a warning."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED_MODULES[spec.name.rpartition(".")[2]]
        _warn(spec.name, new)
        homes = [importlib.import_module(f"{_PACKAGE}.{path}") for path in new]
        if len(homes) == 1:
            return homes[0]
        joined = types.ModuleType(spec.name, f"Moved to {', '.join(new)}.")
        for home in reversed(homes):
            joined.__dict__.update(
                {key: value for key, value in vars(home).items() if not key.startswith("__")}
            )
        return joined

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is already there: nothing to run."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
