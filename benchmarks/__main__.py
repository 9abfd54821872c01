"""``python -m benchmarks switcher | server-load | tiny-servers | gpu-speed [options]`` (see the package)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

USAGE = "usage: python -m benchmarks {switcher,server-load,tiny-servers,gpu-speed} [options] (--help each)"


def _switcher(argv: Sequence[str]) -> int:
    from .switcher.cli import main

    return main(argv)


def _server_load(argv: Sequence[str]) -> int:
    from .server_load.cli import main

    return main(argv)


def _gpu_speed(argv: Sequence[str]) -> int:
    from .gpu_speed.cli import main

    return main(argv)


def _tiny_servers(argv: Sequence[str]) -> int:
    from .tiny_servers import main

    return main(argv)


BENCHMARKS: dict[str, Callable[[Sequence[str]], int]] = {
    "switcher": _switcher,
    "server-load": _server_load,
    "tiny-servers": _tiny_servers,
    "gpu-speed": _gpu_speed,
}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(USAGE, file=sys.stderr)
        return 2
    return BENCHMARKS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
