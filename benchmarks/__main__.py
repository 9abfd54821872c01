"""``python -m benchmarks gpu-speed | server-load | client-cost | health-probe | authors-loop
| context-length [options]`` (see the package)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

USAGE = (
    "usage: python -m benchmarks "
    "{gpu-speed,server-load,client-cost,health-probe,authors-loop,context-length} [options] "
    "(--help each)"
)
BENCHMARKS = {  # each one's package; its cli module has main(argv) -> exit status
    "gpu-speed": "gpu_speed",
    "server-load": "server_load",
    "client-cost": "client_cost",
    "health-probe": "health_probe",
    "authors-loop": "authors_loop",
    "context-length": "context_length",
}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(USAGE, file=sys.stderr)
        return 2
    cli = importlib.import_module(f"benchmarks.{BENCHMARKS[argv[0]]}.cli")
    status: int = cli.main(argv[1:])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
