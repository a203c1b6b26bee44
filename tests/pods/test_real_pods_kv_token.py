"""The cluster token on the transfer path, on real pods: a pod that the NetworkPolicy lets in (it carries
kvferry's label) and that knows the Redis password, but not the cluster token, asks the prefill pod's transfer
engine for a read over UCX. Nothing answers it, nothing lands in its memory, and the prefill pod counts the
attempt. The same pod with the token is answered (a refusal of the range it made up: it does not know where
the pool lies), so the test fails as well when the check lets everyone in as when it lets no one. (Named to
sort before test_real_pods_teardown.py, which takes the tier's cluster down.)"""

from __future__ import annotations

import base64
import json

from pods.probe_pod import run_in_pod
from pods.served_cluster import CLUSTER, NODE_PORT, ServedCluster

from kvferry.redis_password import with_password

# The outsider's read must time out: a short deadline. The member's must be answered: a deadline far above
# the milliseconds it takes, because a new connection's first packets pass the NetworkPolicy agent's user-space
# verdict (tests/pods/node.sh), and a SYN it drops is sent again 1, 3, 7 s later; CI once saw the member's
# read time out at 5 s, on a machine where 16 reads in a row took 7-18 ms.
OUTSIDER_TIMEOUT_S = 5
MEMBER_TIMEOUT_S = 30
# First the prefill pod's HTTP port, until it answers: the node's NetworkPolicy agent drops connections from a
# pod address it has not learnt yet, which would look like the silence this test is about.
READER = """
import json, os, socket, sys, time
import torch
from kvferry.transfer import TransferConfig, TransferEngine
peer, timeout, peer_http = sys.argv[1], float(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 30
while True:
    try:
        socket.create_connection((peer_http, int(sys.argv[4])), timeout=2).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
engine = TransferEngine(TransferConfig(timeout_seconds=timeout, cluster_token=os.environ.get("TOKEN") or None))
engine.initialize(os.environ["NAME"], os.environ["REGISTRY"], "ucx")
memory = torch.full((1 << 16,), 7, dtype=torch.uint8)
engine.register_memory(memory.data_ptr(), memory.numel())
started = time.monotonic()
try:
    engine.batch_transfer_read(peer, [memory.data_ptr()], [1 << 20], [memory.numel()])
    outcome = "read"
except Exception as error:
    outcome = type(error).__name__
print(json.dumps({"outcome": outcome, "untouched": bool((memory == 7).all()), "seconds": time.monotonic() - started,
                  "address": socket.gethostbyname(socket.gethostname()), "transfer": engine.stats}))
"""


def _secret(served: ServedCluster, key: str) -> str:
    secret = json.loads(served.kubectl("get", "secret", f"{CLUSTER}-internal", "-o", "json").stdout)
    return base64.b64decode(secret["data"][key]).decode()


def _unanswered(served: ServedCluster, prefill: dict, member: dict[str, object], before: dict[str, int]) -> str:
    """What a member's unanswered read leaves to go on: the prefill pod's transfer counters before and after it
    (did a message of the member's arrive, and was it refused?), its log and the NetworkPolicy agent's verdicts
    on the member's connections."""
    after = served.stats(prefill)["transfer"]
    log = served.kubectl("logs", prefill["metadata"]["name"], "--tail=40", check=False).stdout
    verdicts = "\n".join(served.kube.policy_verdicts(str(member["address"]))[-40:])
    return (f"{member}\nprefill transfer counters before the member's read: {before}\nafter: {after}\n"
            f"prefill log:\n{log}\npolicy verdicts:\n{verdicts}")


def test_a_transfer_peer_without_the_cluster_token_gets_no_kv(served: ServedCluster) -> None:
    [prefill] = served.ready_pods("prefill")
    config = json.loads(served.get("configmap", f"{CLUSTER}-config")["data"]["cluster.json"])
    registry = with_password(config["redis"]["url"], _secret(served, "redis-password"))
    before = served.stats(prefill)["transfer"]["unauthenticated_messages"]

    def read(name: str, token: str, timeout_s: float) -> dict[str, object]:
        """What the reader got ("outcome", "untouched"), how long its read took ("seconds") and its pod's IP."""
        env = {"NAME": name, "REGISTRY": registry, "TOKEN": token}
        return run_in_pod(served, name, "app.kubernetes.io/name=kvferry", READER, prefill["metadata"]["name"],
                          str(timeout_s), prefill["status"]["podIP"], str(NODE_PORT), env=env, run_s=60)  # fmt: skip

    outsider = read("transfer-outsider", "", OUTSIDER_TIMEOUT_S)
    assert (outsider["outcome"], outsider["untouched"]) == ("TransferTimeoutError", True), outsider
    counted = served.stats(prefill)["transfer"]["unauthenticated_messages"]
    assert counted > before

    before_member = served.stats(prefill)["transfer"]
    member = read("transfer-member", _secret(served, "cluster-token"), MEMBER_TIMEOUT_S)
    assert (member["outcome"], member["untouched"]) == ("TransferRejectedError", True), \
        _unanswered(served, prefill, member, before_member)
    after_member = served.stats(prefill)["transfer"]
    assert after_member["unauthenticated_messages"] == counted
    assert after_member["rejected_reads"] == before_member["rejected_reads"] + 1  # the prefill pod's refusal
