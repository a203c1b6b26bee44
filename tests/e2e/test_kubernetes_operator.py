"""The operator on the real control plane: children, readiness through kwok, scaling, rollouts, deletion."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import yaml
from e2e.example_cluster import CHILD_KINDS, EXAMPLE, EXPECTED_CHILDREN, NAME, SELECTOR, example
from e2e.kube_cluster import TEST_RESYNC_S, Cluster, OperatorProcess

from kvferry.operator.connection import load_configuration
from kvferry.operator.kube import Kube
from kvferry.operator.reconcile import ReconcileSettings, reconcile, refresh_status

HANDLED = "kvferry.dev/last-handled-configuration"


def child_counts(cluster: Cluster) -> Counter[str]:
    return Counter(item["kind"] for item in cluster.items(CHILD_KINDS, SELECTOR))


def ready_pods(cluster: Cluster, role: str) -> list[dict[str, Any]]:
    pods = cluster.items("pods", f"{SELECTOR},kvferry.dev/role={role}")
    return [
        pod
        for pod in pods
        if pod["status"].get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
    ]


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def handled_once(cluster: Cluster, operator: OperatorProcess) -> None:
    """Wait until kopf has stored the creation as handled, and check the create handler ran exactly once.

    kopf logs one line per attempt of a handler, so a retry would show up as a second line.
    """

    def handled() -> bool:
        body = cluster.get("inferencecluster", NAME) or {}
        return HANDLED in body.get("metadata", {}).get("annotations", {})

    cluster.wait("kopf's last-handled-configuration annotation", handled, 30)
    assert operator.log().count("Handler 'reconcile-on-create'") == 1, operator.log()


def assert_left_alone_across_resyncs(cluster: Cluster, operator: OperatorProcess, periods: int = 2) -> None:
    """A settled object is not written again: no status or kopf annotation changes over a few resyncs.

    Call it only once the status reflects every child (a child turning Ready is a real change, and its
    write is right). The resyncs are counted from now, so a loaded machine only makes the wait longer.
    """
    before = cluster.get("inferencecluster", NAME)
    done = f"resynced {cluster.namespace}/{NAME}"
    resyncs = operator.log().count(done)
    cluster.wait(
        f"{periods} more resyncs",
        lambda: operator.log().count(done) >= resyncs + periods,
        periods * TEST_RESYNC_S + 30,
    )
    after = cluster.get("inferencecluster", NAME)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], _written(before, after)
    assert operator.troubles() == []


def _written(before: dict, after: dict) -> str:
    """What a write changed, and who wrote it (managedFields), for the assertion's message."""
    changed = {
        key: (before.get(key), after.get(key))
        for key in ("status", "spec")
        if before.get(key) != after.get(key)
    }
    annotations = (before["metadata"].get("annotations"), after["metadata"].get("annotations"))
    if annotations[0] != annotations[1]:
        changed["annotations"] = annotations
    managers = [(f.get("manager"), f.get("operation"), f.get("time")) for f in after["metadata"].get("managedFields", [])]
    return f"the settled object was written again: {json.dumps(changed, indent=1)}\nmanagers: {managers}"


def test_example_becomes_ready_with_expected_children(cluster: Cluster, start_operator) -> None:
    start_operator()
    cluster.apply(EXAMPLE.read_text())
    status = cluster.wait_phase(NAME, "Ready")

    owner = cluster.get("inferencecluster", NAME)["metadata"]["uid"]
    assert child_counts(cluster) == EXPECTED_CHILDREN
    for child in cluster.items(CHILD_KINDS, SELECTOR):
        [ref] = child["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "InferenceCluster",
            NAME,
            owner,
            True,
        )

    prefill = cluster.get("deployment", f"{NAME}-prefill")
    container = container_of(prefill)
    assert container["image"] == "localhost/kvferry:0.1.0"
    assert container["args"][:3] == ["prefill", "--config", "/etc/kvferry/cluster.json"]
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    volumes = {v["name"]: v for v in prefill["spec"]["template"]["spec"]["volumes"]}
    assert "model" not in volumes  # the example's model is a folder inside the image
    assert cluster.get("service", f"{NAME}-prefill")["spec"]["clusterIP"] == "None"
    assert cluster.get("service", f"{NAME}-decode")["spec"]["clusterIP"] == "None"
    router_service = cluster.get("service", f"{NAME}-router")
    assert (
        router_service["spec"]["type"] == "ClusterIP" and router_service["spec"]["ports"][0]["port"] == 8000
    )
    assert container_of(cluster.get("deployment", f"{NAME}-router"))["args"][0] == "router"
    assert (
        cluster.get("deployment", f"{NAME}-router")["spec"]["template"]["spec"]["serviceAccountName"]
        == f"{NAME}-router"
    )
    config = yaml.safe_load(cluster.get("configmap", f"{NAME}-config")["data"]["cluster.json"])
    assert config["redis"]["url"] == f"redis://{NAME}-redis.{cluster.namespace}.svc:6379/0"
    assert config["model"]["path"] == "/models/smollm2-135m-instruct"
    assert config["transfer"]["ucxTransports"] == ["tcp", "sm", "self"]  # the nodes' UCX_TLS

    for role, count in (("prefill", 1), ("decode", 1), ("router", 2)):
        assert len(ready_pods(cluster, role)) == count, f"{role} pods not Running+Ready through kwok"
        assert status[role] == {"desired": count, "ready": count, "updated": count}
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
    }
    assert status["routerEndpoint"] == f"http://{NAME}-router.{cluster.namespace}.svc:8000"

    table = cluster.kubectl("get", "inferenceclusters").stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PREFILL", "READY", "DECODE", "READY", "ROUTER", "AGE"]
    assert table[1].split()[:5] == [NAME, "Ready", "1", "1", status["routerEndpoint"]]


def test_scale_prefill_up_and_down(cluster: Cluster, start_operator) -> None:
    start_operator()
    cluster.apply(EXAMPLE.read_text())
    cluster.wait_phase(NAME, "Ready")
    for replicas in (3, 1):
        cluster.patch_spec(NAME, {"prefill": {"replicas": replicas}})
        status = cluster.wait_phase(NAME, "Ready")
        assert status["prefill"] == {"desired": replicas, "ready": replicas, "updated": replicas}
        assert cluster.get("deployment", f"{NAME}-prefill")["spec"]["replicas"] == replicas
        cluster.wait(
            f"{replicas} prefill pods",
            lambda replicas=replicas: (
                len(cluster.items("pods", f"{SELECTOR},kvferry.dev/role=prefill")) == replicas
            ),
        )
        assert len(ready_pods(cluster, "prefill")) == replicas


def test_image_and_kv_changes_roll_out(cluster: Cluster, start_operator) -> None:
    start_operator()
    cluster.apply(EXAMPLE.read_text())
    cluster.wait_phase(NAME, "Ready")
    before = cluster.get("deployment", f"{NAME}-decode")["spec"]["template"]["metadata"]["annotations"]
    # The cluster's own token and Redis password: made once, owned by the cluster, read by every pod.
    internal = cluster.get("secret", f"{NAME}-internal")
    assert sorted(internal["data"]) == ["cluster-token", "redis-password"]
    assert [owner["kind"] for owner in internal["metadata"]["ownerReferences"]] == ["InferenceCluster"]

    cluster.patch_spec(NAME, {"image": "ghcr.io/kvferry/kvferry:0.2.0"})
    cluster.wait_phase(NAME, "Ready")
    assert cluster.get("secret", f"{NAME}-internal")["data"] == internal["data"]  # a reconcile keeps them
    for role in ("prefill", "decode", "router"):
        sets = cluster.items("replicasets", f"{SELECTOR},kvferry.dev/role={role}")
        live = [rs for rs in sets if rs["spec"]["replicas"] > 0]
        assert len(sets) == 2, f"{role}: a rollout leaves the old ReplicaSet scaled to 0"
        assert [container_of(rs)["image"] for rs in live] == ["ghcr.io/kvferry/kvferry:0.2.0"]
        pods = ready_pods(cluster, role)
        assert {pod["spec"]["containers"][0]["image"] for pod in pods} == {"ghcr.io/kvferry/kvferry:0.2.0"}

    cluster.patch_spec(NAME, {"kvCache": {"blockSize": 32}})
    cluster.wait_phase(NAME, "Ready")
    after = cluster.get("deployment", f"{NAME}-decode")["spec"]["template"]["metadata"]["annotations"]
    assert after["kvferry.dev/config-hash"] != before["kvferry.dev/config-hash"]
    assert len(cluster.items("replicasets", f"{SELECTOR},kvferry.dev/role=decode")) == 3
    config = yaml.safe_load(cluster.get("configmap", f"{NAME}-config")["data"]["cluster.json"])
    assert config["kvCache"]["blockSize"] == 32


def test_delete_removes_every_child(cluster: Cluster, start_operator) -> None:
    start_operator()
    cluster.apply(EXAMPLE.read_text())
    cluster.wait_phase(NAME, "Ready")
    assert child_counts(cluster) == EXPECTED_CHILDREN
    cluster.kubectl("delete", "inferencecluster", NAME, "--wait=true", "--timeout=60s")
    # The controller-manager's garbage collector follows the owner references; the operator does nothing.
    cluster.wait(
        "every child garbage-collected",
        lambda: not cluster.items(f"{CHILD_KINDS},replicasets,pods", SELECTOR),
        90,
    )


def test_turning_managed_redis_off_prunes_it(cluster: Cluster, start_operator) -> None:
    start_operator()
    cluster.apply(EXAMPLE.read_text())
    cluster.wait_phase(NAME, "Ready")
    cluster.patch_spec(NAME, {"redis": {"managed": False, "url": "redis://shared-redis:6379/0"}})
    cluster.wait_phase(NAME, "Ready")
    cluster.wait(
        "redis children deleted",
        lambda: not cluster.items("deployments,services", f"{SELECTOR},kvferry.dev/role=redis"),
    )
    config = yaml.safe_load(cluster.get("configmap", f"{NAME}-config")["data"]["cluster.json"])
    assert config["redis"]["url"] == "redis://shared-redis:6379/0"


def test_a_child_deleted_by_hand_comes_back(cluster: Cluster, start_operator) -> None:
    operator = start_operator("--log-format=json")
    cluster.apply(EXAMPLE.read_text())
    cluster.wait_phase(NAME, "Ready")
    uid = cluster.get("service", f"{NAME}-decode")["metadata"]["uid"]
    done = f"resynced {cluster.namespace}/{NAME}"

    def resyncs_logged() -> int:
        # The operator logs in JSON: one object a line.
        lines = [json.loads(line) for line in operator.log().splitlines() if line.strip()]
        return sum(done in line["message"] for line in lines)

    before = resyncs_logged()
    cluster.kubectl("delete", "service", f"{NAME}-decode")
    restored = cluster.wait(
        "decode Service re-created by the resync", lambda: cluster.get("service", f"{NAME}-decode"), 30
    )
    assert restored["metadata"]["uid"] != uid
    # The resync logs once its whole reconcile is done, a moment after it re-created the Service (a repeated
    # run once read the log in between: 1 failure in 3 runs of the e2e tier, the Service back, no line yet).
    cluster.wait("the resync's line in the log", lambda: resyncs_logged() > before, TEST_RESYNC_S + 30)


def test_model_source_that_cannot_work_is_degraded_without_retrying(cluster: Cluster, start_operator) -> None:
    operator = start_operator()
    manifest = example()
    manifest["spec"]["model"]["source"] = "s3://bucket/tiny-llama"
    cluster.apply(manifest)
    status = cluster.wait_phase(NAME, "Degraded")
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert degraded["message"].startswith(
        "spec.model.source: 's3://bucket/tiny-llama': unsupported scheme 's3'"
    )
    assert child_counts(cluster) == {}

    # No hot loop: kopf ran the create handler once and schedules no retry; with no child to change the
    # status, the resyncs find nothing to write.
    handled_once(cluster, operator)
    assert_left_alone_across_resyncs(cluster, operator)
    assert operator.log().count("invalid spec") >= 3  # the create and each resync saw the problem

    cluster.patch_spec(NAME, {"model": {"source": "/opt/models/tiny-llama"}})
    status = cluster.wait_phase(NAME, "Ready")
    assert next(c for c in status["conditions"] if c["type"] == "Degraded")["status"] == "False"


def test_child_the_apiserver_refuses_is_degraded_without_retrying(cluster: Cluster, start_operator) -> None:
    operator = start_operator()
    manifest = example()
    manifest["spec"]["prefill"]["nodeSelector"] = {"not a label key!": "x"}  # the schema allows any key
    cluster.apply(manifest)
    status = cluster.wait_phase(NAME, "Degraded")
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ApplyFailed"
    assert degraded["message"].startswith(f"Deployment {NAME}-prefill: ")
    assert "nodeSelector" in degraded["message"]
    handled_once(cluster, operator)
    # Redis comes before the prefill Deployment, so it exists and turns Ready through kwok, possibly
    # after the create was handled: the next resync rightly writes that into the Ready condition.
    cluster.wait(
        "the status to count Redis Ready",
        lambda: (
            next(c for c in cluster.status(NAME)["conditions"] if c["type"] == "Ready")["message"]
            == "prefill 0/1, decode 0/1, router 0/2, redis 1/1 ready"
        ),
        TEST_RESYNC_S + 60,
    )
    assert_left_alone_across_resyncs(cluster, operator)
    assert cluster.status(NAME)["phase"] == "Degraded"


class StaleFirstRead(Kube):
    """The operator's real client, except that its first read of the InferenceCluster returns an older
    copy: a child event that read the parent just before a reconcile wrote its status (a fault, named so)."""

    def __init__(self, configuration: Any, stale: dict[str, Any]) -> None:
        super().__init__(configuration)
        self._stale: dict[str, Any] | None = stale

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind == "InferenceCluster" and self._stale is not None:
            stale, self._stale = self._stale, None
            return stale
        return super().get(api_version, kind, namespace, name)


def test_a_child_event_that_read_the_parent_before_a_reconcile_leaves_its_problem_standing(cluster: Cluster) -> None:
    manifest = example()
    manifest["spec"]["prefill"]["nodeSelector"] = {"not a label key!": "x"}  # refused by the apiserver
    cluster.apply(manifest)
    before_reconcile = cluster.get("inferencecluster", NAME)
    configuration = load_configuration(cluster.kube.kubeconfig)
    reconcile(Kube(configuration), before_reconcile, ReconcileSettings())
    degraded = cluster.get("inferencecluster", NAME)
    assert degraded["status"]["phase"] == "Degraded"

    refresh_status(StaleFirstRead(configuration, before_reconcile), cluster.namespace, NAME)
    after = cluster.get("inferencecluster", NAME)
    assert after["metadata"]["resourceVersion"] == degraded["metadata"]["resourceVersion"], _written(degraded, after)
