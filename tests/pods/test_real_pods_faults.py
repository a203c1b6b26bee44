"""The fault matrix on real pods (docs/reliability.md, rows 16.x): a decode pod deleted, drained with
`kubectl drain`, OOM-killed; Redis's pod restarted; the network between the prefill pod and a decode pod cut;
then decode scaled in to one pod, and that only decode pod deleted.

Each test runs a bounded loop of streaming clients through the router's Service (serving_loop.py: every
stream must give its undisturbed greedy text, every token once) while it disturbs one pod, waits for the
cluster to recover, and states its promise: where a peer of the lost pod exists, zero failed and zero
refused requests, and no KV held anywhere afterwards; where none does, clean errors within 5 s, then
answers again once the pod is back. The module starts with the two decode pods test_real_pods.py leaves and
ends with one.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cluster.waiting import wait_until
from pods.served_cluster import CLUSTER, READY_S, SERVED_NAME, ServedCluster
from pods.serving_loop import undisturbed_texts

MIGRATIONS = "kvferry:router_migrations_total"
TRANSFER_FAILURES = "kvferry:kv_transfer_failures_total"
LOCAL_PREFILLS = "kvferry:local_prefills_total"
RECEIVED = "kvferry:kv_received_bytes_total"
CLEAN_ERROR_S = 5.0
DRAIN_LABEL = "test.kvferry.dev/drain"
# Run in a decode container: makes its main process (PID 1, the decode node) the OOM killer's choice, then
# fills the container's memory limit from small children, each too small to be chosen before it. Bounded:
# whatever happens, it ends within a minute.
OOM_HOG = """
import os, time
with open('/proc/1/oom_score_adj', 'w') as f:
    f.write('1000')
for _ in range(100):
    if os.fork() == 0:
        block = bytearray(b'x') * (64 << 20)
        time.sleep(60)
        os._exit(0)
    time.sleep(0.05)
time.sleep(60)
"""


@pytest.fixture(scope="module")
def expected(served: ServedCluster) -> dict[str, str]:
    served.scale("decode", 2)  # as test_real_pods.py leaves it; set here too, so the module runs alone
    return undisturbed_texts(served.router, SERVED_NAME)


@pytest.fixture
def migrations(served: ServedCluster) -> Iterator[Callable[[], float]]:
    """Streams the routers migrated since the test began."""
    routers = served.ready_pods("router")
    before = sum(served.metric(router, MIGRATIONS, outcome="migrated") for router in routers)
    yield lambda: sum(served.metric(router, MIGRATIONS, outcome="migrated") for router in routers) - before


def _decoding_pod(served: ServedCluster) -> dict[str, Any]:
    """A decode pod with a stream running on it right now, while its peer is ready too: the one to disturb."""
    def one() -> dict[str, Any] | None:
        pods = served.ready_pods("decode")
        return next((pod for pod in pods if served.stats(pod)["running"] >= 1), None) if len(pods) == 2 else None

    return wait_until("a decode pod decoding a stream", one, 120, interval=0.1)


def _recovered(served: ServedCluster, count: int, gone: dict[str, Any] | None = None,
               back: dict[str, Any] | None = None) -> Callable[[], object]:
    """Recovered: `count` decode pods ready, `gone` not among them (the InferenceCluster's status alone may
    still count a deleted pod for a moment), `back` among them (a container restarted in its pod)."""
    def names() -> list[str]:
        ready = [pod["metadata"]["name"] for pod in served.ready_pods("decode")]
        ok = (len(ready) == count and (gone is None or gone["metadata"]["name"] not in ready)
              and (back is None or back["metadata"]["name"] in ready))
        return ready if ok else []

    return lambda: wait_until(f"{count} decode pods ready (without {gone and gone['metadata']['name']}, with "
                              f"{back and back['metadata']['name']})", names, READY_S)


def test_a_deleted_decode_pod_fails_no_stream_while_another_serves(served, expected, migrations) -> None:
    """Deleted, the decode pod leaves the router's choice, and after its preStop sleep and SIGTERM the streams
    it has end within its drain (drainSeconds, 30 s) or are cut then and migrated by the router."""
    victim: dict[str, Any] = {}

    def delete() -> None:
        victim.update(_decoding_pod(served))
        served.kubectl("delete", "pod", victim["metadata"]["name"], "--wait=false")

    outcomes = served.under_load(expected, "a decode pod deleted", delete,
                           _recovered(served, 2, gone=victim))
    print(f"streams migrated: {migrations():.0f}")
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)


def test_a_drained_decode_pod_fails_no_stream(served, expected, migrations) -> None:
    """`kubectl drain` of the node, with a pod selector naming one decode pod (this node is the only one: a
    whole drain would evict the router too). The node is cordoned, so the replacement waits for `uncordon`.
    The eviction is a SIGTERM, as above."""
    victim: dict[str, Any] = {}

    def drain() -> None:
        victim.update(_decoding_pod(served))
        name, node = victim["metadata"]["name"], victim["spec"]["nodeName"]
        served.kubectl("label", "pod", name, f"{DRAIN_LABEL}=now")
        try:
            served.kube.kubectl("drain", node, f"--pod-selector={DRAIN_LABEL}=now", "--ignore-daemonsets",
                                "--delete-emptydir-data", "--timeout=120s")
        finally:
            served.kube.kubectl("uncordon", node)

    outcomes = served.under_load(expected, "a decode pod drained", drain,
                           _recovered(served, 2, gone=victim))
    print(f"streams migrated: {migrations():.0f}")
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)


def test_an_oom_killed_decode_container_fails_no_stream(served, expected, migrations) -> None:
    victim: dict[str, Any] = {}

    def last_termination() -> dict[str, Any]:
        [status] = served.get("pod", victim["metadata"]["name"])["status"]["containerStatuses"]
        return status.get("lastState", {}).get("terminated") or {}

    def oom() -> None:
        victim.update(_decoding_pod(served))
        served.kubectl("exec", victim["metadata"]["name"], "--", "python3", "-c", OOM_HOG, check=False)
        wait_until(lambda: f"the decode container OOM-killed: {last_termination()}",
                   lambda: last_termination().get("reason") == "OOMKilled", 60)

    outcomes = served.under_load(expected, "a decode container OOM-killed", oom,
                           _recovered(served, 2, back=victim))  # restarted in its pod
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)
    assert migrations() >= 1  # no grace: the streams it decoded were cut, and went on elsewhere


def test_a_restarted_redis_pod_fails_no_request(served, expected) -> None:
    """Redis holds the prefix index and the node registry: while it is away, and back but empty until each
    node's next heartbeat, the nodes and the router go on from what they last read. The prefill pod still
    finds every decode pod it knew (no transfer fails for want of a registry record); any local prefill is
    a transfer that timed out on the loaded machine, as at any other time."""
    [prefill] = served.ready_pods("prefill")
    unreachable_before = served.metric(prefill, TRANSFER_FAILURES, reason="peer_unreachable")
    [old] = served.ready_pods("redis")

    def new_redis_ready() -> object:
        return wait_until("a new Redis pod ready", lambda: [
            pod for pod in served.ready_pods("redis") if pod["metadata"]["name"] != old["metadata"]["name"]], READY_S)

    outcomes = served.under_load(expected, "Redis's pod restarted",
                           lambda: served.kubectl("delete", "pod", old["metadata"]["name"], "--wait=false"),
                           new_redis_ready)
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)
    assert served.metric(prefill, TRANSFER_FAILURES, reason="peer_unreachable") == unreachable_before


def test_a_partition_between_the_prefill_pod_and_a_decode_pod_fails_no_request(served, expected) -> None:
    """Packets from the prefill pod to one decode pod dropped (iptables in the prefill pod's network namespace):
    that pod's requests lose their KV transfer and it prefills them itself, with the same tokens; healed, KV
    crosses to it again."""
    [prefill] = served.ready_pods("prefill")
    victim = served.ready_pods("decode")[0]
    rule = ["OUTPUT", "--destination", victim["status"]["podIP"], "--jump", "DROP"]
    iptables = ["nsenter", "--target", str(served.container_pid(prefill)), "--net", "iptables", "--wait"]
    local_before = served.metric(victim, LOCAL_PREFILLS)

    def partition() -> None:
        subprocess.run([*iptables, "--insert", *rule], check=True, timeout=60)
        try:
            time.sleep(3)  # a write under way when the rule went in ends within its 2 s timeout
            received = served.metric(victim, RECEIVED)
            wait_until("the cut-off decode pod prefilling for itself",
                       lambda: served.metric(victim, LOCAL_PREFILLS) >= local_before + 2, 300)
            assert served.metric(victim, RECEIVED) == received, "KV crossed the partition"
        finally:
            subprocess.run([*iptables, "--delete", *rule], check=True, timeout=60)

    def kv_crosses_again() -> object:
        received = served.metric(victim, RECEIVED)
        return wait_until("KV reaching the decode pod again", lambda: served.metric(victim, RECEIVED) > received, 300)

    outcomes = served.under_load(expected, "prefill pod cut off from a decode pod", partition, kv_crosses_again)
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)


def test_decode_scaled_in_under_load_fails_no_stream(served, expected) -> None:
    """2 -> 1 (the way back of test_real_pods.py's 1 -> 2): the removed pod leaves the router's choice at once
    and finishes its streams within its drain; nothing fails, nothing is refused or cut short."""
    outcomes = served.under_load(expected, "decode scaled 2 -> 1",
                                 lambda: served.patch_spec(CLUSTER, {"decode": {"replicas": 1}}),
                                 lambda: served.wait_scaled("decode", 1))
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)


def test_the_only_decode_pod_deleted_gives_clean_errors_fast_then_serves_again(served, expected) -> None:
    served.scale("decode", 1)  # as the test before leaves it; set here too, so the test runs alone
    [only] = served.ready_pods("decode")

    outcomes = served.under_load(expected, "the only decode pod deleted",
                                 lambda: served.kubectl("delete", "pod", only["metadata"]["name"], "--wait=false"),
                                 _recovered(served, 1, gone=only), workers=2)
    assert outcomes.failed == [], served.described(outcomes)
    assert outcomes.refused, "no request was refused while no decode pod served"
    assert outcomes.longest_wait_for_refusal_s < CLEAN_ERROR_S, served.described(outcomes)
