"""This process's open file descriptors and sockets (Linux ``/proc``), for the tests that
check that models close their connections."""

from __future__ import annotations

import contextlib
import os
from urllib.parse import urlsplit


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def connections_to(base_url: str) -> int:
    """This process's sockets connected to `base_url`'s port (the clients' ends: a server in
    this process has its ends on that port as local port, not remote), whatever else the
    process opens or closes meanwhile."""
    port = urlsplit(base_url).port
    inodes: set[str] = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)  # the header
            for line in lines:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                count += remote_port == port and fields[9] in inodes
    return count
