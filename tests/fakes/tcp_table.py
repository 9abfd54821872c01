"""TCP connections as the kernel lists them (``/proc/net/tcp``): which are open to a port."""

from __future__ import annotations

from pathlib import Path

ESTABLISHED = "01"


def established(port: int) -> set[frozenset[str]]:
    """Established TCP connections with an end on `port`, each as the pair of its ends'
    addresses (so a connection with both ends on this host counts once)."""
    connections = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            ports = {int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)}
            if state == ESTABLISHED and port in ports:
                connections.add(frozenset((local, remote)))
    return connections
