"""``python -m benchmarks health-probe``: the relay server's CPU per health probe.

A ``relaygen serve`` process over the scripted upstream (both in processes of their own) is
probed by a client on one kept-alive connection: ``/livez`` (the process only), ``/readyz``
with the upstreams' state cached (``--health-cache-seconds 1``, the default) and with no cache
(``0``: every call probes both upstreams over the relay's own connections). The relay's CPU
time over N calls, read from ``/proc``, divided by N, is the cost of one call; rounds
interleave the three so that the machine's drift falls on all of them alike.
"""
