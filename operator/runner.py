"""Run the operator: connect, optionally wait for the leader lease, then run kopf until told to stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from dataclasses import dataclass

from kubernetes.client import Configuration

from kvferry.operator.autoscaler import Autoscaler, autoscale_until
from kvferry.operator.connection import load_configuration
from kvferry.operator.handlers import build_registry
from kvferry.operator.health import start_health_server
from kvferry.operator.kube import Kube
from kvferry.operator.leader import LeaseElector, run_as_leader
from kvferry.operator.reconcile import ReconcileSettings
from kvferry.operator.resync import resync_until

logger = logging.getLogger("kvferry.operator")


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: str | None
    namespaces: tuple[str, ...]  # empty: every namespace
    leader_election: bool
    lease_name: str
    lease_namespace: str
    lease_duration_s: float
    identity: str
    pod_uid: str | None  # the operator's own pod, the Lease's owner (leader.py)
    resync_s: float
    autoscale_s: float
    health_host: str
    health_port: int  # 0: no health endpoint
    reconcile: ReconcileSettings


async def _run_kopf(
    config: OperatorConfig, kube: Kube, configuration: Configuration, lost: threading.Event
) -> None:
    import kopf

    registry = build_registry(kube, configuration, config.reconcile)
    stop_flag = asyncio.Event()
    loop = asyncio.get_running_loop()
    finished = threading.Event()
    threading.Thread(
        target=resync_until,
        args=(kube, config.namespaces, config.reconcile, config.resync_s, finished),
        name="resync",
        daemon=True,
    ).start()

    def forward_lost() -> None:
        # kopf waits on a threading.Event through an executor thread that never returns; an asyncio
        # flag set from here lets the loop shut down cleanly.
        while not finished.is_set():
            if lost.wait(0.5):
                loop.call_soon_threadsafe(stop_flag.set)
                return

    threading.Thread(target=forward_lost, name="lease-lost", daemon=True).start()
    ready = asyncio.Event()
    signals_to_stop_flag = asyncio.create_task(_stop_on_signals(ready, stop_flag))
    threading.Thread(
        target=autoscale_until,
        args=(Autoscaler(kube, config.namespaces, config.reconcile), config.autoscale_s, finished),
        name="autoscaler",
        daemon=True,
    ).start()
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,  # the Lease decides who runs; kopf's own peering stays off
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            stop_flag=stop_flag,
            ready_flag=ready,
        )
    finally:
        signals_to_stop_flag.cancel()
        finished.set()


async def _stop_on_signals(ready: asyncio.Event, stop_flag: asyncio.Event) -> None:
    """Once kopf is ready, SIGTERM and SIGINT set the stop flag in place of kopf's own signal handlers.

    Why: stopped by a signal, kopf leaves the task that waits for its stop flag pending and then waits 5 s
    (its fixed allowance for hung tasks) before it returns: every operator pod's stop, a rollout's or a
    leader hand-over's, took 5 s longer. Stopped by the flag, it returns at once. kopf installs its handlers
    before it is ready, so these replace them."""
    await ready.wait()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():  # where kopf installed its own
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop_flag.set)


def run_operator(config: OperatorConfig) -> int:
    configuration = load_configuration(config.kubeconfig)
    kube = Kube(configuration)

    def lead(lost: threading.Event) -> int:
        asyncio.run(_run_kopf(config, kube, configuration, lost))
        return 0

    if not config.leader_election:
        if config.health_port:
            start_health_server(config.health_host, config.health_port, lambda: True)
        return lead(threading.Event())

    elector = LeaseElector(
        kube, config.lease_name, config.lease_namespace, config.identity, config.lease_duration_s, config.pod_uid
    )
    if config.health_port:
        start_health_server(config.health_host, config.health_port, lambda: elector.leading)
    stop = threading.Event()
    # Until kopf installs its own handlers, SIGTERM/SIGINT end the wait for the lease.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return run_as_leader(elector, lead, stop)
