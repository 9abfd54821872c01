"""Event-loop stalls: which callback kept a loop's thread, for how long, and where it was.

An asyncio loop runs one callback at a time (a task's step, a ``call_soon`` callback); while
one runs, every other task of the loop waits. A callback that blocks (``time.sleep``, a sync
HTTP request, ``future.result()``, a lock) or computes for long without an ``await`` stalls the
loop: timeouts do not fire, streams stop, a server in the same loop cannot answer. The monitor
watches every event loop of the process, in any thread, whoever made it (``asyncio.run``,
pytest-asyncio, ``run_until_complete`` in sync code, a library's own background loop)::

    from relay_integrations.testing.loop_monitor import LoopMonitor

    with LoopMonitor(threshold=0.05) as monitor:
        asyncio.run(main())
    monitor.check()        # raises LoopStalled naming each stall's callback and stack
    monitor.stalls         # or read them: Stall(thread, seconds, callback, where)

How it works: while a monitor watches, asyncio's ``Handle._run`` (every loop callback runs
in it, tasks' steps included) numbers each callback it runs and notes the number by thread; a
thread of the monitor's own reads those numbers every ``interval`` seconds. A loop waiting for
I/O is in its selector's poll, outside any callback, and is never counted. The same number
seen in successive samples is one callback still running, and each interval between two
samples adds what the callback's thread did with it:

- blocked in a system call (``time.sleep``, a socket's ``connect`` or ``recv``): the whole
  interval, but the time the thread then waited for a CPU;
- waiting on a lock from ``threading``, ``queue`` or ``concurrent.futures`` (as
  ``Future.result()`` does): the whole interval, but the longest time any thread of the
  process waited for a CPU in it (the thread that would release the lock may be one of them);
- anything else (running Python or C code, or waiting for the GIL): the CPU time the thread
  used (Linux's ``/proc/self/task/<tid>/schedstat``; ``/proc/.../syscall`` says which call).

Garbage collection is left out too: the collector runs in whichever thread's allocation set it
off, and its pause (hundreds of milliseconds over a large heap) is the process's, not that
callback's (``gc.callbacks`` time it).

So a busy machine does not make stalls: on two shared cores a thread can wait tens of
milliseconds for a CPU (or for a new thread to start), or for the GIL that another thread of
the process holds (a scripted server on its own thread), inside any callback, however short;
none of it counts. A callback that
sleeps 200 ms counts 200 ms however loaded the machine is; one that computes for 60 ms counts
its 60 ms of CPU. A loop that is busy but yields (many short callbacks) shows a new callback at
every sample and never stalls. The count starts at the first sample that sees the callback, so
it is a lower bound (a monitor kept off the CPU for most of a stall can miss it). Where
``/proc`` is missing (not Linux), the wall time counts, and a loaded machine can then report
stalls that are its own.

Stacks are read with :func:`faulthandler.dump_traceback`, which walks every thread's frames in
C while holding the GIL: a consistent picture, where walking another thread's frames in
Python (``sys._current_frames()`` and ``f_back``) lets that thread run between two steps of
the walk and can crash the interpreter. A stall is reported with the stack where the
callback was when it was first seen past the threshold: the line that blocks
(``time.sleep(0.2)`` in the coroutine that called it, the ``future.result()`` a sync bridge
waits on). ``held`` keeps the time of every callback seen in two samples or more, to measure
what a workload's callbacks cost on a given machine.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import itertools
import os
import platform
import re
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, replace
from types import TracebackType
from typing import IO, Self


@dataclass(frozen=True)
class Stall:
    """A callback that held its event loop's thread past the threshold."""

    thread: str
    """The name of the loop's thread."""
    seconds: float
    """How long it held the thread, time spent waiting for a CPU left out (at least)."""
    callback: str
    """The callback, by the code it runs: a task's coroutine, a callback's function."""
    where: str
    """The callback's stack when it first passed the threshold, outermost first."""

    def __str__(self) -> str:
        return (
            f"the event loop of thread {self.thread!r} was held {self.seconds * 1e3:.0f} ms by "
            f"one callback, {self.callback}:\n{self.where}"
        )


class LoopStalled(AssertionError):
    """Raised by :meth:`LoopMonitor.check`: a loop's callback held its thread too long."""

    def __init__(self, stalls: list[Stall]) -> None:
        self.stalls = stalls
        super().__init__("\n\n".join(str(s) for s in stalls))


@dataclass
class _Running:
    """The callback a loop thread was last seen running (by its number), and what its thread
    had used of the CPU (on it, waiting for it) at the last sample."""

    number: int
    cpu: float
    waited: float
    collected: float
    held: float = 0.0
    seen: int = 1


class LoopMonitor:
    """Watches every event loop of the process for callbacks that hold their thread longer
    than `threshold` seconds, sampling every `interval` seconds (see the module)."""

    def __init__(self, threshold: float = 0.05, interval: float = 0.005) -> None:
        if not 0 < interval < threshold:
            raise ValueError(
                f"interval={interval} must be positive and below threshold={threshold}"
            )
        self.threshold = threshold
        self.interval = interval
        self.held: list[float] = []
        """Seconds each callback held its thread, for every callback seen in two samples or
        more (waiting for a CPU left out)."""
        self._stalls: dict[int, Stall] = {}  # by callback number: one report each, at its longest
        self._running: dict[int, _Running] = {}
        self._collecting: dict[int, float] = {}  # thread -> when its collection started
        self._collected: dict[int, float] = {}  # thread -> seconds spent collecting garbage
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stalls(self) -> list[Stall]:
        """The stalls seen so far (each callback once, at its longest)."""
        with self._lock:
            return list(self._stalls.values())

    def take(self) -> list[Stall]:
        """The stalls seen so far, forgotten here (a callback still running past the
        threshold is reported again, at its end or at the next take, if it grows)."""
        with self._lock:
            taken, self._stalls = self._stalls, {}
        return list(taken.values())

    def check(self) -> None:
        """Raise :class:`LoopStalled` for the stalls seen so far (then forgotten)."""
        stalls = self.take()
        if stalls:
            raise LoopStalled(stalls)

    def start(self) -> Self:
        if self._thread is None:
            _numbering(+1)
            gc.callbacks.append(self._garbage_collected)
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="loop-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
            gc.callbacks.remove(self._garbage_collected)
            _numbering(-1)
        with self._lock:
            for running in self._running.values():
                self._ended(running)
            self._running.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    # -- sampling ---------------------------------------------------------------------------

    def _garbage_collected(self, phase: str, info: dict[str, int]) -> None:
        """Time the garbage collector takes, per thread: it runs in whichever thread's
        allocation set it off, and its pause is the process's, not that callback's."""
        ident, now = threading.get_ident(), time.monotonic()
        if phase == "start":
            self._collecting[ident] = now
        elif (started := self._collecting.pop(ident, None)) is not None:
            self._collected[ident] = self._collected.get(ident, 0.0) + now - started

    def _collecting_time(self, ident: int, now: float) -> float:
        started = self._collecting.get(ident)
        return self._collected.get(ident, 0.0) + (now - started if started is not None else 0.0)

    def _watch(self) -> None:
        last, queued = time.monotonic(), _queued()
        with tempfile.TemporaryFile() as dump:
            while not self._stop.wait(self.interval):
                now, queued_now = time.monotonic(), _queued()
                step, last = now - last, now
                # the longest any thread of the process waited for a CPU in this step
                crowded = max(
                    (queued_now[t] - queued.get(t, queued_now[t]) for t in queued_now),
                    default=0.0,
                )
                queued = queued_now
                numbers = _RUNNING.copy()
                with self._lock:
                    for ident in list(self._running):
                        running = self._running[ident]
                        if numbers.get(ident) != running.number:  # ended, another one runs
                            self._ended(self._running.pop(ident))
                    going = any(ident in self._running for ident in numbers)
                    stacks = _stacks(dump) if going else {}  # only a callback seen before needs one
                    threads = {t.ident: t for t in threading.enumerate()}
                    for ident, number in numbers.items():
                        if _RUNNING.get(ident) != number:  # it ended while the stacks were read
                            if ident in self._running:
                                self._ended(self._running.pop(ident))
                            continue
                        thread = threads.get(ident)
                        self._sample(ident, number, stacks.get(ident), thread, step, crowded)

    def _sample(
        self,
        ident: int,
        number: int,
        stack: _Stack | None,
        thread: threading.Thread | None,
        step: float,
        crowded: float,
    ) -> None:
        native = thread.native_id if thread is not None else None
        cpu, waited = _schedstat(native)
        collected = self._collecting_time(ident, time.monotonic())
        running = self._running.get(ident)
        if running is None:
            self._running[ident] = _Running(number, cpu, waited, collected)
            return
        if stack is None:  # the thread was not in the dump (it is ending): nothing to add
            return
        running.seen += 1
        waits = _Waits(waited - running.waited, crowded)
        held = _held(native, stack, step, cpu - running.cpu, waits)
        running.held += max(0.0, held - (collected - running.collected))
        running.cpu, running.waited, running.collected = cpu, waited, collected
        if running.held > self.threshold:
            # where it was when it first passed the threshold: the line that held the loop
            # (later it may have moved on, e.g. to an executor's shutdown after a result)
            first = self._stalls.get(number)
            name = thread.name if thread is not None else str(ident)
            self._stalls[number] = (
                Stall(name, running.held, stack.describe(), stack.format())
                if first is None
                else replace(first, seconds=running.held)
            )

    def _ended(self, running: _Running) -> None:
        if running.seen > 1:
            self.held.append(running.held)


# -- numbering the loops' callbacks -------------------------------------------------------------

_RUNNING: dict[int, int] = {}
"""Thread -> the number of the innermost loop callback it runs (while a monitor watches)."""
_NUMBERS = itertools.count(1)
_HANDLE_RUN = asyncio.events.Handle._run
_watching = 0
_watching_lock = threading.Lock()


def _numbered_run(handle: asyncio.Handle) -> None:
    """``Handle._run``, noting the callback's number for its thread while it runs."""
    ident = threading.get_ident()
    outer = _RUNNING.get(ident)  # a loop run inside another loop's callback
    _RUNNING[ident] = next(_NUMBERS)
    try:
        _HANDLE_RUN(handle)
    finally:
        if outer is None:
            del _RUNNING[ident]
        else:
            _RUNNING[ident] = outer


def _numbering(change: int) -> None:
    """Count a monitor in (+1) or out (-1): callbacks are numbered while any watches."""
    global _watching
    with _watching_lock:
        _watching += change
        asyncio.events.Handle._run = _numbered_run if _watching else _HANDLE_RUN  # type: ignore[method-assign,assignment]


# -- stacks -------------------------------------------------------------------------------------

_THREAD_LINE = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME_LINE = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')
_EVENTS_PY = f"asyncio{os.sep}events.py"


def _stacks(dump: IO[bytes]) -> dict[int, _Stack]:
    """Every thread's stack, read at once (``faulthandler`` walks them in C, GIL held)."""
    dump.seek(0)
    dump.truncate()
    faulthandler.dump_traceback(dump, all_threads=True)
    dump.seek(0)
    stacks: dict[int, list[tuple[str, int, str]]] = {}
    frames: list[tuple[str, int, str]] = []
    for line in dump.read().decode("utf-8", "replace").splitlines():
        if thread := _THREAD_LINE.match(line):
            frames = stacks.setdefault(int(thread[1], 16), [])
        elif frame := _FRAME_LINE.match(line):
            line_number = int(frame[2]) if frame[2].isdigit() else 0
            frames.append((frame[1], line_number, frame[3]))
    return {ident: _Stack.of(innermost_first) for ident, innermost_first in stacks.items()}


@dataclass(frozen=True)
class _Stack:
    """A thread's frames inside the innermost loop callback it runs (outermost first, as file,
    line and function), and its innermost file."""

    inside: tuple[tuple[str, int, str], ...]
    innermost_file: str

    @classmethod
    def of(cls, innermost_first: list[tuple[str, int, str]]) -> _Stack:
        inside: list[tuple[str, int, str]] = []
        for frame in innermost_first:
            if frame[2] == "_run" and frame[0].endswith(_EVENTS_PY):
                break
            inside.append(frame)
        innermost = innermost_first[0][0] if innermost_first else ""
        return cls(tuple(reversed(inside)), innermost)

    def starting_a_thread(self) -> bool:
        """Whether the thread waits in ``Thread.start`` for the new thread to begin (an
        executor adding a worker, ``asyncio.to_thread``'s first calls): the new thread's wait
        for a CPU, which the process's waits do not show until it has run."""
        threading_py = f"{os.sep}threading.py"
        return any(n == "start" and f.endswith(threading_py) for f, _, n in self.inside)

    def describe(self) -> str:
        """The callback, by the code it runs (a task's coroutine, a callback's function)."""
        if not self.inside:
            return "a callback in C code"
        filename, line, name = self.inside[0]
        return f"{name}() of {filename}:{line}"

    def format(self) -> str:
        """The stack from the callback's own code to the innermost frame."""
        summary = traceback.StackSummary.from_list(
            [traceback.FrameSummary(f, line, n) for f, line, n in self.inside]
        )
        return "".join(summary.format())


@dataclass(frozen=True)
class _Waits:
    """Seconds of one step that threads spent waiting for a CPU: the callback's own thread,
    and the longest of any thread of the process."""

    own: float
    longest: float


def _held(native: int | None, stack: _Stack, step: float, cpu: float, waits: _Waits) -> float:
    """How much of the last `step` seconds a thread in a callback held its loop: the CPU it
    used, or, blocked in a call, all of the step but its wait for a CPU (and, blocked on a
    lock, the wait for a CPU of the thread that would release it: any of the process's);
    never the time it waited for the GIL, which other threads of the process held."""
    call = _syscall(native)
    if call is None:  # no /proc: wall time
        return step
    if call == "running":  # on a CPU, or waiting for one
        return cpu
    if call == _FUTEX:
        if not stack.innermost_file.endswith(_WAITS):
            return cpu  # the GIL: a lock waited for outside the threading module's waits
        if stack.starting_a_thread():
            return cpu  # waits for the OS to run the new thread: a CPU wait, not its own
        return max(cpu, step - waits.longest)
    return max(cpu, step - waits.own)


_FUTEX = {"x86_64": "202", "aarch64": "98", "arm64": "98"}.get(platform.machine())
_WAITS = (
    f"{os.sep}threading.py",
    f"{os.sep}queue.py",
    f"futures{os.sep}_base.py",
    f"multiprocessing{os.sep}synchronize.py",
)
"""Where a thread waits on a lock on purpose (``Condition.wait``, ``Thread.join``,
``Future.result``, ``Queue.get``): a futex wait there blocks; elsewhere it is the GIL's."""


def _read_task(task: int | str, name: str) -> str:
    """The text of ``/proc/self/task/<task>/<name>``. Not through ``pathlib``: Python 3.11
    interns each part of a path for good, and thread ids are new for every thread the process
    starts (the interned table then grows, and resizes, under a long-running program)."""
    with open(f"/proc/self/task/{task}/{name}", encoding="ascii") as file:
        return file.read()


def _syscall(native: int | None) -> str | None:
    """The system call `native` (a thread's id) is blocked in, or ``"running"``."""
    if native is None:
        return None
    try:
        return _read_task(native, "syscall").split(maxsplit=1)[0]
    except (OSError, IndexError):
        return None


def _queued() -> dict[str, float]:
    """Seconds each thread of the process has waited for a CPU (empty without /proc)."""
    queued = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return {}
    for task in tasks:
        try:
            queued[task] = int(_read_task(task, "schedstat").split()[1]) / 1e9
        except (OSError, IndexError):  # ended since it was listed
            continue
    return queued


def _schedstat(native: int | None) -> tuple[float, float]:
    """Seconds thread `native` has spent on a CPU, and runnable but waiting for one (Linux's
    schedstat; zeros where it cannot say)."""
    if native is None:
        return 0.0, 0.0
    try:
        fields = _read_task(native, "schedstat").split()
    except OSError:
        return 0.0, 0.0
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9
