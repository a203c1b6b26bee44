"""The pods tier's last module: the cluster taken down the way a user would, and nothing left anywhere."""

from __future__ import annotations

import json

from cluster.waiting import wait_until
from pods.real_node import PodsNode
from pods.served_cluster import CLUSTER, NAMESPACE, RELEASE, ServedCluster


def test_deleting_the_resource_and_uninstalling_leave_nothing(served: ServedCluster) -> None:
    served.kubectl("delete", "inferencecluster", CLUSTER, "--wait", "--timeout=300s")
    served.kube.helm("uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait", "--timeout=5m")
    wait_until("no pods", lambda: not served.items("pods"), 300, interval=2)
    kinds = ("services,configmaps,deployments,replicasets,serviceaccounts,roles,rolebindings,leases,"
             "poddisruptionbudgets,inferenceclusters")
    left = [f"{item['kind']}/{item['metadata']['name']}" for item in served.items(kinds)
            if (item["kind"], item["metadata"]["name"]) not in {("ConfigMap", "kube-root-ca.crt"),
                                                                ("ServiceAccount", "default")}]
    assert left == []
    cluster_scoped = json.loads(served.kube.kubectl("get", "clusterroles,clusterrolebindings", "-o", "json").stdout)
    assert [item["metadata"]["name"] for item in cluster_scoped["items"] if "kvferry" in item["metadata"]["name"]] == []
    # A finalizer left on anything would hold the namespace in Terminating.
    served.kube.kubectl("delete", "namespace", NAMESPACE, "--wait", "--timeout=120s")


def test_taking_the_node_down_leaves_nothing_behind(pods_node: PodsNode) -> None:
    pods_node.down()
    assert pods_node.leftovers() == []
