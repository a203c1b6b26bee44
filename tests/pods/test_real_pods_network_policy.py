"""NetworkPolicy on real pods, as the chart installs it by default and kube-network-policies enforces it on the
node (tests/pods/node.sh): a pod that is not kvferry's, in the cluster's own namespace, reaches the router's
Service but neither a decode pod nor the cluster's Redis; a pod labelled as kvferry's reaches both, so the
test fails as well when nothing is enforced as when everything is blocked.

Each probe is a short-lived pod of the kvferry image (its Python) that tries each address for a bounded time
and prints what it got; it is deleted at the end. The tier's cluster is left as it was."""

from __future__ import annotations

from pods.probe_pod import run_in_pod
from pods.served_cluster import CLUSTER, NODE_PORT, RELEASE, ServedCluster

# Each address is tried again until it answers or this many seconds pass: long enough for the agent to learn
# a new pod's address (a connection from an address it does not know yet is dropped), short for a test.
REACH_S = 10
PROBE = """
import json, socket, sys, time
def reach(address):
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + float(sys.argv[1])
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return "connected"
        except OSError as error:
            if time.monotonic() > deadline:
                return type(error).__name__
            time.sleep(0.5)
print(json.dumps({address: reach(address) for address in sys.argv[2:]}))
"""


def probe_from(served: ServedCluster, name: str, labels: str, addresses: list[str]) -> dict[str, str]:
    """Run PROBE in a pod labelled `labels`; each address's outcome: "connected" or the error's name."""
    return run_in_pod(served, name, labels, PROBE, str(REACH_S), *addresses, run_s=REACH_S * len(addresses))


def test_only_kvferry_pods_reach_the_nodes_and_redis(served: ServedCluster) -> None:
    for suffix in ("", "-nodes", "-router"):  # the chart's defaults made them
        assert served.get("networkpolicy", f"{RELEASE}{suffix}") is not None, f"{RELEASE}{suffix}"
    decode = f"{served.ready_pods('decode')[0]['status']['podIP']}:{NODE_PORT}"
    redis_service = served.get("service", f"{CLUSTER}-redis")
    redis = f"{redis_service['spec']['clusterIP']}:{redis_service['spec']['ports'][0]['port']}"
    router = served.router.removeprefix("http://")

    outsider = probe_from(served, "netpol-outsider", "app=netpol-outsider", [router, decode, redis])
    assert outsider[router] == "connected", outsider
    assert outsider[decode] != "connected" and outsider[redis] != "connected", outsider

    insider = probe_from(served, "netpol-insider", "app.kubernetes.io/name=kvferry", [decode, redis])
    assert insider == {decode: "connected", redis: "connected"}, insider
