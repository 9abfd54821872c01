"""What one generation measured, as the report and ``--json`` read it::

    Generation(context=4096, prompt_tokens=4071, path="tokens", wall=1.9,
               switches=4, api_cpu={"large": 0.21, "small": 0.12},
               requests={"large": 5, "small": 5}, request_bytes={"large": 9000, "small": 8000},
               routes={"/v1/completions": 8, "/tokenize": 2}, text_ok=True)

and what one request of each kind costs the large API server (:mod:`.probes`)::

    RequestCost(context=32768, kind="completion, prompt as ids", api_cpu=0.021)

``path`` is the column ("text", "tokens", or "alone": the large model writing the trace in one
chat completion).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay_integrations.relay import ModelRole

PATHS = ("text", "tokens")
ALONE = "alone"


@dataclass(frozen=True)
class Generation:
    context: int  # the length asked
    prompt_tokens: int  # the rendered chat's tokens, measured
    path: str  # text | tokens | alone
    wall: float  # seconds
    switches: int
    api_cpu: dict[ModelRole, float]  # seconds of each API server's CPU (not its EngineCore's)
    requests: dict[ModelRole, int]  # requests each server answered
    request_bytes: dict[ModelRole, int]  # their bodies' bytes (Content-Length)
    routes: dict[str, int] = field(default_factory=dict)  # requests by route, both servers
    text_ok: bool = True  # wrote the trace

    def cpu_per_switch(self, role: ModelRole) -> float:
        """API-server CPU seconds a switch (nan without switches: the large model alone)."""
        return self.api_cpu[role] / self.switches if self.switches else float("nan")


@dataclass(frozen=True)
class RequestCost:
    context: int
    kind: str
    api_cpu: float  # seconds of the large API server's CPU a request


@dataclass
class Measured:
    generations: list[Generation] = field(default_factory=list)
    costs: list[RequestCost] = field(default_factory=list)
