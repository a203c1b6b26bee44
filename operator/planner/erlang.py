"""How many servers a pool of FIFO servers behind one queue needs for a target wait: Erlang C (M/M/c).

The prefill replicas are such a pool: the router sends each prompt to the replica whose queue empties
first, which serves prompts in arrival order as one queue before all of them would. With `erlangs` the
offered work (the mean number of busy servers it keeps) and S the mean service time, a prompt waits at all
with probability C(c, erlangs) (Erlang's C formula), and longer than t with C x exp(-(c - erlangs) t / S).
The smallest c that keeps that under 1 - quantile meets a wait target at that quantile. Poisson arrivals
and exponential services are an idealisation (the planner's other rules answer a wait that misses anyway);
what the model gets right, and a fixed utilisation target does not, is the pool's economy of scale: a
small pool needs relatively more servers to spare than a large one.
"""

from __future__ import annotations

import math


def waiting_probability(servers: int, erlangs: float) -> float:
    """Erlang C: the chance that a prompt finds every server busy (1 when the pool cannot keep up)."""
    if erlangs <= 0:
        return 0.0
    if servers <= erlangs:
        return 1.0
    blocking = 1.0  # Erlang B, by its recurrence over the servers (stable where the closed form overflows)
    for count in range(1, servers + 1):
        blocking = erlangs * blocking / (count + erlangs * blocking)
    return servers * blocking / (servers - erlangs * (1 - blocking))


def servers_for_wait(erlangs: float, mean_service_s: float, wait_s: float, quantile: float) -> int:
    """The fewest servers whose wait stays within `wait_s` for `quantile` of the prompts."""
    servers = max(1, math.floor(erlangs) + 1)
    while waiting_probability(servers, erlangs) * math.exp(-(servers - erlangs) * wait_s / mean_service_s) > 1 - quantile:
        servers += 1
    return servers
