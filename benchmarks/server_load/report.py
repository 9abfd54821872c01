"""The printed report, a function a section (all figures in ms unless said)."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Sequence

from ..machine import MachineFacts
from .figures import (
    CpuFigures,
    Figures,
    LoadFigures,
    MemoryFigures,
    SingleFigures,
    Summary,
    WorkerCountFigures,
)
from .processes import Processes, Relay
from .settings import Settings


def load_rows(figures: LoadFigures) -> list[tuple[str, Summary]]:
    """The rows of the load table: label, figure."""
    server, core = figures.server, figures.core
    return [
        ("server: client total", server.total),
        ("server: relay seconds", server.relay_seconds),
        ("server: added (total - seconds)", server.added),
        ("server: client TTFT", server.ttft),
        ("server: relay TTFT", server.relay_ttft),
        ("server: TTFT added", server.ttft_added),
        ("core: total", core.total),
        ("core: relay seconds", core.relay_seconds),
        ("core: total - seconds", core.added),
        ("core: TTFT", core.ttft),
    ]


def ms(value: float) -> str:
    return f"{value * 1000:9.1f}"


def report(figures: Figures, facts: MachineFacts, processes: Processes, settings: Settings) -> None:
    """Every section but the relay's log (printed once the relay stopped)."""
    header(facts, [processes.relay_command_line], settings)
    single(figures.single, settings)
    load(figures.load, settings)
    memory(figures.memory_mb)
    cpu(figures.cpu_during_server_rounds, facts.cpus)
    event_loop(figures.metrics_probe_seconds)
    outcome(figures)


def header(facts: MachineFacts, relays: Sequence[str], settings: Settings) -> None:
    print(f"machine   {facts.cpus} CPUs ({facts.cpus_usable} usable), {facts.platform}")
    print(f"python    {facts.python}")
    print(f"load avg  {facts.load_at_start} (before)  {facts.load_at_end} (after)")
    print(f"command   {facts.command}")
    for relay in relays:
        print(f"relay     {relay}")
    print(f"upstream  scripted pair, {settings.token_delay} s/token, own process\n")


def single(figures: SingleFigures, settings: Settings) -> None:
    print(f"Single request, nothing else running (p50 of {settings.sequential} sequential)")
    print(f"  {'':28}{'total ms':>9}{'ttft ms':>9}{'relay s':>9}{'added':>9}")
    for f, label in ((figures.server, "server (HTTP)"), (figures.core, "in-process core")):
        print(
            f"  {label:28}{ms(f.total.p50)}{ms(f.ttft.p50)}"
            f"{ms(f.relay_seconds.p50)}{ms(f.added.p50)}"
        )
    diff = figures.server.total.p50 - figures.core.total.p50
    print(f"  {'server - core':28}{ms(diff)}\n")


def load(figures: LoadFigures, settings: Settings) -> None:
    n, rounds = settings.concurrency, settings.rounds
    print(f"Load: {n} concurrent streams x {rounds} rounds ({n * rounds} generations per path)")
    print(f"  {'ms':38}{'p50':>9}{'p99':>9}{'max':>9}")
    for label, f in load_rows(figures):
        print(f"  {label:38}{ms(f.p50)}{ms(f.p99)}{ms(f.max)}")
    s, c = figures.server.total, figures.core.total
    print(f"  {'server/core total (ratio)':38}{s.p50 / c.p50:9.2f}{s.p99 / c.p99:9.2f}")
    rate = figures.generations_per_second
    print(f"  generations/s: server {rate.server:.1f}, core {rate.core:.1f}")
    print(
        f"  switches per generation: server {figures.server.switches}, core "
        f"{figures.core.switches}; tokens/generation {figures.server.mean_tokens:.0f}\n"
    )


def memory(mem: MemoryFigures) -> None:
    print("Memory of the relay server process (MB)")
    print(f"  idle after startup VmRSS        {mem.idle:8.1f}")
    print(f"  after the single requests       {mem.after_single_requests:8.1f}")
    print(
        f"  peak VmRSS during load          {mem.peak_rss_sampled:8.1f}  ({mem.rss_samples} samples)"
    )
    print(f"  VmHWM at end                    {mem.hwm_at_end:8.1f}")
    print(f"  per concurrent stream above idle{mem.peak_above_idle_per_stream:8.3f}")
    rounds_rss = ", ".join(f"{v:.1f}" for v in mem.after_each_server_round)
    print(f"  VmRSS after each server round   {rounds_rss}")
    print(f"  VmRSS 1 s after the load        {mem.after_load_1s:8.1f}\n")


def cpu(figures: CpuFigures, cpus: int | None) -> None:
    use = figures.utilisation
    print(
        f"CPU during the server rounds ({figures.wall_seconds:.1f} s): relay {use.relay:.0%}, "
        f"upstream {use.upstream:.0%}, this client {use.client:.0%} of one core; "
        f"relay {figures.relay_ms_per_generation:.1f} ms CPU per generation; the machine's "
        f"other processes used {figures.other_processes_cores:.2f} of its "
        f"{cpus} cores meanwhile"
    )


def event_loop(lag: Summary) -> None:
    print(
        f"GET /metrics during the server rounds ({lag.n} probes): p50 {lag.p50 * 1000:.0f} "
        f"ms, max {lag.max * 1000:.0f} ms (how far behind the relay's event loop is)"
    )


def outcome(figures: Figures) -> None:
    print(f"relay_inflight_generations after the load: {figures.relay_inflight_after_load:g}")
    errors = figures.errors + figures.single.errors
    print(f"errors: {len(errors)}")
    for message, count in Counter(errors).most_common(10):
        print(f"  {count} x {message}")


def relay_log(lines: Sequence[str]) -> None:
    if lines:
        print(f"relay log: {len(lines)} lines at warning and above; the first ones:")
        for line in lines[:5]:
            print(f"  {line[:300]}")


def workers(
    figures: Sequence[WorkerCountFigures],
    facts: MachineFacts,
    relays: Sequence[Relay],
    settings: Settings,
) -> None:
    """The ``--workers`` run: one row per worker count, ratios against the first row."""
    header(facts, [shlex.join(relay.command) for relay in relays], settings)
    n, rounds = settings.concurrency, settings.rounds
    print(f"relaygen serve --workers N: {n} concurrent streams x {rounds} rounds each, in turns")
    print(
        f"  {'workers':>7}{'gen/s':>8}{'ratio':>7}{'CPU ms/gen':>12}{'ratio':>7}{'busiest':>9}"
        f"{'p50 ms':>9}{'p99 ms':>9}   cores: {'relay':>6}{'upstream':>9}{'client':>7}{'others':>7}"
    )
    first = figures[0]
    for f in figures:
        use = f.utilisation
        print(
            f"  {f.workers:>7}{f.generations_per_second:8.1f}"
            f"{f.generations_per_second / first.generations_per_second:7.2f}"
            f"{f.cpu_ms_per_generation:12.1f}"
            f"{f.cpu_ms_per_generation / first.cpu_ms_per_generation:7.2f}"
            f"{f.busiest_process_share:9.0%}{ms(f.total.p50)}{ms(f.total.p99)}"
            f"   {'':7}{use.relay:6.2f}{use.upstream:9.2f}{use.client:7.2f}"
            f"{f.other_processes_cores:7.2f}"
        )
    print(
        f"  ratio: against {first.workers} worker(s); CPU: the relay's whole process tree "
        "(supervisor and workers); busiest: the share of it the busiest process used; cores: "
        f"of the machine's {facts.cpus}, used during each relay's rounds (others: the "
        "machine's other processes)"
    )
    failures = [error for f in figures for error in f.errors]
    print(f"errors: {len(failures)}")
    for message, count in Counter(failures).most_common(10):
        print(f"  {count} x {message}")
