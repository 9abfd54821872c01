"""``relaygen serve --workers N``: N processes serving one listening port, under a supervisor.

One relay process is one event loop, busy with every stream it serves; workers put more cores
to work behind one address, as uvicorn's and gunicorn's ``--workers`` do::

    serve_workers(RelayConfig.from_env(), ServerSettings.from_env(workers=4))

This process (the supervisor) binds the port, then starts N worker processes (spawned: a fresh
interpreter each, the configuration pickled). Each builds its own :class:`.RelayServer` and
serves on the shared socket as one process does (:mod:`.draining`); the kernel hands each new
connection to one of them. The supervisor serves nothing itself; it

* on SIGTERM or SIGINT closes its copy of the socket and sends SIGTERM to every worker: each
  stops accepting, answers ``/health`` with 503 on the connections it has, and lets its
  in-flight streams finish for ``shutdown_timeout`` seconds, as one process does. Once all
  have exited, it returns (``relaygen serve`` exits 0); a worker still running
  `KILL_AFTER` seconds past the timeout is killed;
* replaces a worker that dies (logged, with how it ended);
* stops them all when one exits before it is ready to serve (a bad configuration, say) and
  raises :class:`WorkerStartError` with its reason: there is no restart loop;
* sets ``PROMETHEUS_MULTIPROC_DIR`` for the workers' shared metrics (see :mod:`.metrics`): a
  fresh temporary directory removed at exit, or the directory the environment names.

A worker whose supervisor is gone (killed with SIGKILL) drains and exits as on SIGTERM. Every
log record says which process wrote it (``pid``). Code that calls this (or :func:`.runner.serve`
with workers > 1) runs under ``if __name__ == "__main__":``, as any code that spawns processes.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

import uvicorn
from prometheus_client.multiprocess import mark_process_dead
from pydantic import BaseModel

from ..relay.config import RelayConfig
from ..upstream.errors import RelayError
from .app import RelayServer
from .draining import DrainingServer, uvicorn_config
from .logs import configure_logging, log
from .metrics import MULTIPROC_DIR
from .settings import ServerSettings

READY = "ready"
"""What a worker reports once it serves; otherwise it reports why it could not start."""
KILL_AFTER = 10.0
"""Seconds past ``shutdown_timeout`` a stopping worker gets before it is killed."""
BACKLOG = 2048
"""Connections the kernel queues until a worker accepts them (uvicorn's default)."""


class WorkerStartError(RelayError):
    """The workers could not be started, or one stopped before it was ready to serve."""


def serve_workers(config: RelayConfig, settings: ServerSettings) -> None:
    """Serve on ``settings.workers`` processes until SIGTERM/SIGINT; blocks."""
    _check_picklable(config, settings)
    configure_logging(settings.log_format, settings.log_level, with_pid=True)
    with _metrics_directory(), _listening_socket(settings.host, settings.port) as sock:
        Supervisor(config, settings, sock).run()


@dataclass
class Worker:
    """One worker process, and the pipe on which it says whether it started (closed once
    it has: ready, the reason it could not start, or its exit)."""

    number: int
    process: BaseProcess
    reports: Connection
    ready: bool = False
    failure: str | None = None


class Supervisor:
    """Starts, replaces and stops the workers (see the module's docstring)."""

    def __init__(self, config: RelayConfig, settings: ServerSettings, sock: socket.socket):
        self.config = config
        self.settings = settings
        self.sock = sock
        self.context = multiprocessing.get_context("spawn")
        self.workers: dict[int, Worker] = {}
        self.stopping = False
        self.kill_at = math.inf
        self.failure: str | None = None
        self._signalled = False
        self._wake_read, self._wake_write = os.pipe()

    def run(self) -> None:
        """Start the workers and supervise them until they have all exited."""
        stop_signals = (signal.SIGTERM, signal.SIGINT)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in stop_signals}
        try:
            for number in range(1, self.settings.workers + 1):
                self._start(number)
            while self.workers:
                self._step()
        finally:
            for worker in self.workers.values():  # only when the supervisor itself failed
                worker.process.terminate()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(self._wake_read)
            os.close(self._wake_write)
        if self.failure is not None:
            raise WorkerStartError(self.failure)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = True
        os.write(self._wake_write, b"\0")  # wakes the wait() of _step

    def _start(self, number: int) -> None:
        reports, child_end = self.context.Pipe(duplex=False)
        process = self.context.Process(
            target=run_worker,
            args=(self.config, self.settings, self.sock, child_end),
            name=f"relaygen-worker-{number}",
            daemon=True,  # should the supervisor itself fail, its exit stops the workers
        )
        process.start()
        child_end.close()  # the worker holds it now; its exit shows as the end of the pipe
        self.workers[number] = Worker(number, process, reports)
        log.info("worker started", extra=_fields(self.workers[number]))

    def _step(self) -> None:
        """Wait for a signal, a report or an exit, and act on it."""
        listening = [w.reports for w in self.workers.values() if not w.reports.closed]
        sentinels = [w.process.sentinel for w in self.workers.values()]
        timeout = None if self.kill_at == math.inf else max(self.kill_at - time.monotonic(), 0)
        if self._wake_read in wait([self._wake_read, *sentinels, *listening], timeout):
            os.read(self._wake_read, 64)
        if self._signalled and not self.stopping:
            log.info("stopping the workers", extra={"fields": {"workers": len(self.workers)}})
            self._stop()
        for worker in list(self.workers.values()):
            self._read_report(worker)
            if not worker.process.is_alive():
                self._exited(worker)
        if time.monotonic() >= self.kill_at:
            for worker in self.workers.values():
                log.error("worker still running; killing it", extra=_fields(worker))
                worker.process.kill()
            self.kill_at = math.inf  # once; their exits end the loop

    def _stop(self) -> None:
        """New connections are refused once every copy of the socket is closed; each worker
        closes its own on SIGTERM and drains."""
        self.stopping = True
        self.kill_at = time.monotonic() + self.settings.shutdown_timeout + KILL_AFTER
        self.sock.close()
        for worker in self.workers.values():
            worker.process.terminate()

    def _read_report(self, worker: Worker) -> None:
        if worker.reports.closed or not worker.reports.poll():
            return
        try:
            report = worker.reports.recv()
        except EOFError:
            report = None  # it exited without a word; _exited says how
        worker.reports.close()
        worker.ready = report == READY
        worker.failure = None if worker.ready or report is None else str(report)
        if worker.ready and not self.stopping and all(w.ready for w in self.workers.values()):
            url = f"http://{self.settings.host}:{self.sock.getsockname()[1]}"
            pids = [w.process.pid for w in self.workers.values()]
            log.info("serving", extra={"fields": {"url": url, "worker_pids": pids}})

    def _exited(self, worker: Worker) -> None:
        worker.process.join()
        worker.reports.close()
        del self.workers[worker.number]
        # its in-flight gauge no longer counts (prometheus_client's multiprocess module is not
        # annotated)
        mark_process_dead(worker.process.pid)  # type: ignore[no-untyped-call]
        fields = {**_fields(worker)["fields"], "exit": _exit_description(worker.process)}
        if self.stopping:
            log.info("worker exited", extra={"fields": fields})
        elif not worker.ready:
            reason = worker.failure or f"{fields['exit']} (its log above says why)"
            self.failure = f"worker {worker.number} (pid {worker.process.pid}) could not start: "
            self.failure += reason
            log.error("worker could not start; stopping the server", extra={"fields": fields})
            self._stop()
        else:
            log.error("worker died; starting another", extra={"fields": fields})
            self._start(worker.number)


def run_worker(
    config: RelayConfig, settings: ServerSettings, sock: socket.socket, reports: Connection
) -> None:
    """A worker process: the relay server on the shared socket until SIGTERM."""
    configure_logging(settings.log_format, settings.log_level, with_pid=True)
    # Ctrl+C reaches the whole process group and the supervisor stops the workers with
    # SIGTERM; while serving, uvicorn's own handler takes SIGINT too (a second one cuts the
    # streams, as with one process).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _stop_when_the_supervisor_is_gone()
    try:
        relay = RelayServer(config, settings)
        server = WorkerServer(uvicorn_config(relay), relay, reports)
    except Exception as failed:
        reports.send(f"{type(failed).__name__}: {failed}")
        raise SystemExit(1) from failed
    server.run(sockets=[sock])


class WorkerServer(DrainingServer):
    """A worker's server: tells the supervisor once it serves."""

    def __init__(self, config: uvicorn.Config, relay: RelayServer, reports: Connection) -> None:
        super().__init__(config, relay)
        self.reports = reports

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.reports.send(READY)


def _stop_when_the_supervisor_is_gone() -> None:
    """SIGTERM to this worker when its supervisor's process ends (killed with SIGKILL, say):
    it drains and exits instead of serving on, orphaned."""
    supervisor = multiprocessing.parent_process()
    assert supervisor is not None, "a worker runs in a process its supervisor started"

    def watch() -> None:
        supervisor.join()  # returns when the supervisor's end of a pipe closes: at its exit
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def _check_picklable(config: RelayConfig, settings: ServerSettings) -> None:
    """Refuse, before any worker starts, a configuration that cannot be sent to them."""
    for name, model in (("config", config), ("settings", settings)):
        if not _picklable(model):
            field = _unpicklable_field(model, f"{name}.")
            raise WorkerStartError(
                f"{field} cannot be sent to the worker processes (each gets the configuration "
                "pickled): keep its values plain data (strings, numbers, lists, dicts, as in "
                "JSON), or serve with one worker (workers=1)"
            )


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def _unpicklable_field(model: BaseModel, prefix: str) -> str:
    """The dotted name of the innermost field of `model` that cannot be pickled."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        if not _picklable(value):
            if isinstance(value, BaseModel):
                return _unpicklable_field(value, f"{prefix}{name}.")
            return f"{prefix}{name}"
    return prefix.rstrip(".")


@contextmanager
def _metrics_directory() -> Iterator[str]:
    """The directory of the workers' metric files: the environment's, or a fresh one (set in
    the environment the workers inherit, and removed at the end)."""
    named = os.environ.get(MULTIPROC_DIR)
    if named:
        if not os.path.isdir(named):
            raise WorkerStartError(f"{MULTIPROC_DIR}={named} is not a directory: create it")
        if os.listdir(named):
            log.warning(
                f"{MULTIPROC_DIR} holds files of an earlier run: their counts add to this "
                "run's; empty it before the server starts",
                extra={"fields": {"directory": named}},
            )
        yield named
        return
    fresh = tempfile.mkdtemp(prefix="relaygen-metrics-")
    os.environ[MULTIPROC_DIR] = fresh
    try:
        yield fresh
    finally:
        del os.environ[MULTIPROC_DIR]
        shutil.rmtree(fresh, ignore_errors=True)


def _listening_socket(host: str, port: int) -> socket.socket:
    """The socket every worker accepts on; listening at once, so that connections wait in the
    queue while the workers start."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as failed:
        sock.close()
        raise WorkerStartError(f"cannot listen on {host}:{port}: {failed.strerror}") from failed
    sock.listen(BACKLOG)
    return sock


def _fields(worker: Worker) -> dict[str, dict[str, Any]]:
    return {"fields": {"worker": worker.number, "worker_pid": worker.process.pid}}


def _exit_description(process: BaseProcess) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        return f"ended by {signal.Signals(-code).name}"
    return f"exit code {code}"
