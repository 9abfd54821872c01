"""This process's open file descriptors and sockets (Linux ``/proc``), for the tests that
check that models close their connections."""

from __future__ import annotations

import contextlib
import os


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count
