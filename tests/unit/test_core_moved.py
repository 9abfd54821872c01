"""The old ``relay_integrations.core`` imports keep working, and warn with the new path."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str, warnings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", warnings, "-c", code], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("from relay_integrations.core import RelayConfig", "relay_integrations.relay"),
        ("from relay_integrations.core.switcher import RelaySwitcher", "relay.switcher"),
        ("from relay_integrations.core.endpoint import Endpoint", "upstream.endpoint"),
        (
            "from relay_integrations.core.config import EndpointConfig, SwitchPolicy",
            "relay_integrations.upstream.config and relay_integrations.relay.config",
        ),
    ],
)
def test_an_old_import_warns_with_the_new_path(old: str, new: str) -> None:
    refused = _python(old, "error::DeprecationWarning")
    assert refused.returncode == 1
    assert "DeprecationWarning" in refused.stderr and "has moved: import from" in refused.stderr
    assert new in refused.stderr


def test_an_old_import_gives_the_same_objects() -> None:
    same = _python(
        "from relay_integrations.core import RelaySwitcher\n"
        "from relay_integrations.core.config import EndpointConfig, SwitchPolicy\n"
        "from relay_integrations.core.habits import REFUSED_FIELDS, RESERVED_BODY_FIELDS\n"
        "import relay_integrations.relay as relay, relay_integrations.upstream as upstream\n"
        "from relay_integrations.chat import habits\n"
        "from relay_integrations.upstream import reserved_fields\n"
        "assert RelaySwitcher is relay.RelaySwitcher\n"
        "assert EndpointConfig is upstream.EndpointConfig and SwitchPolicy is relay.SwitchPolicy\n"
        "assert REFUSED_FIELDS is habits.REFUSED_FIELDS\n"
        "assert RESERVED_BODY_FIELDS is reserved_fields.RESERVED_BODY_FIELDS\n"
        "print('same')",
        "ignore::DeprecationWarning",
    )
    assert same.returncode == 0, same.stderr
    assert same.stdout.strip() == "same"


def test_a_name_the_old_package_never_had_is_an_attribute_error() -> None:
    missing = _python("from relay_integrations.core import NoSuchThing", "error")
    assert missing.returncode == 1
    assert "ImportError" in missing.stderr and "NoSuchThing" in missing.stderr
