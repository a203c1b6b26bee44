"""The Helm chart: lint, server-side dry runs, install / upgrade / uninstall, and its RBAC being enough."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from e2e.example_cluster import EXAMPLE, NAME
from e2e.kube_cluster import CRD, Cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kvferry"
EVERYTHING_ON = (
    "redis.enabled=true",
    "networkPolicy.enabled=true",
    "exampleCluster.enabled=true",
    "operator.replicas=2",
)


def release_of(cluster: Cluster) -> tuple[str, str]:
    """Release name and the chart's full name, unique per test: cluster-scoped objects carry them."""
    release = f"kvf-{cluster.namespace.rsplit('-', 1)[-1]}"
    return release, f"{release}-kvferry"


def set_flags(values: tuple[str, ...]) -> list[str]:
    return [flag for value in values for flag in ("--set", value)]


def release_objects(cluster: Cluster) -> list[str]:
    release, _ = release_of(cluster)
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/managed-by=Helm"
    kinds = "deployments,services,serviceaccounts,roles,rolebindings,networkpolicies"
    namespaced = cluster.kubectl("get", kinds, "-l", selector, "-o", "name").stdout.split()
    cluster_wide = cluster.kube.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name"
    ).stdout.split()
    return sorted(namespaced + cluster_wide)


def test_lint_is_clean(cluster: Cluster) -> None:
    for values in ((), EVERYTHING_ON, ("operator.watchNamespaces={a,b}",), ("operator.clusterWide=true",)):
        done = cluster.kube.helm("lint", "--strict", str(CHART), *set_flags(values))
        assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
        assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout


def test_values_schema_rejects_bad_values(cluster: Cluster) -> None:
    for bad in ("operator.replicas=-1", "image.pullPolicy=Sometimes", "operator.unknown=1"):
        done = cluster.kube.helm("lint", str(CHART), "--set", bad, check=False)
        assert done.returncode != 0, bad
        assert "values don't meet the specifications of the schema" in done.stdout + done.stderr
    both = cluster.kube.helm("template", str(CHART), "--set", "operator.clusterWide=true", "--set",
                             "operator.watchNamespaces={a}", check=False)
    assert both.returncode != 0 and "set operator.clusterWide or operator.watchNamespaces, not both" in both.stderr


@pytest.mark.parametrize(
    "values",
    [(), EVERYTHING_ON, ("operator.watchNamespaces={NAMESPACE}", "redis.enabled=true"), ("operator.clusterWide=true",)],
    ids=["defaults", "everything-on", "namespaced", "cluster-wide"],
)
def test_rendered_manifests_pass_a_server_side_dry_run(cluster: Cluster, values: tuple[str, ...]) -> None:
    values = tuple(value.replace("NAMESPACE", cluster.namespace) for value in values)
    rendered = cluster.kube.helm(
        "template", release_of(cluster)[0], str(CHART), f"--namespace={cluster.namespace}", *set_flags(values)
    ).stdout
    documents = [doc for doc in yaml.safe_load_all(rendered) if doc]
    assert documents, "nothing rendered"
    done = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-", input=rendered)
    assert len(done.stdout.splitlines()) == len(documents)
    if "networkPolicy.enabled=false" not in values:  # on by default
        policies = {doc["metadata"]["name"].rsplit("-", 1)[-1]: doc["spec"] for doc in documents if doc["kind"] == "NetworkPolicy"}
        shared_redis = ["redis"] if "redis.enabled=true" in values else []
        assert sorted(policies) == sorted(["kvferry", "nodes", "router", *shared_redis])
        nodes = policies["nodes"]
        assert {"key": "app.kubernetes.io/component", "operator": "In", "values": ["prefill", "decode", "redis"]} in nodes["podSelector"]["matchExpressions"]
        [admitted] = nodes["ingress"]
        assert admitted["from"][0] == {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kvferry"}}}
        assert admitted["from"][1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
        assert policies["router"]["ingress"] == [{}]  # from anywhere
    for doc in documents:
        if doc["kind"] == "Deployment":
            pod = doc["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for container in pod["containers"]:
                assert container["securityContext"] == {
                    "runAsNonRoot": True,
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                }


def test_install_upgrade_uninstall(cluster: Cluster) -> None:
    # helm installs crds/ only when the CRD is missing, so start without it to see helm create it.
    cluster.kube.kubectl("delete", "crd", CRD, "--ignore-not-found", "--wait=true", "--timeout=120s")
    release, fullname = release_of(cluster)
    ns = f"--namespace={cluster.namespace}"
    cluster.kube.helm("install", release, str(CHART), ns, "--wait", "--timeout=120s")

    crd = json.loads(cluster.kube.kubectl("get", "crd", CRD, "-o", "json").stdout)
    assert crd["spec"]["versions"][0]["name"] == "v1alpha1"
    assert release_objects(cluster) == sorted(  # by default the operator's rights end at its own namespace
        [
            f"role.rbac.authorization.k8s.io/{fullname}",
            f"rolebinding.rbac.authorization.k8s.io/{fullname}",
            f"deployment.apps/{fullname}",
            f"role.rbac.authorization.k8s.io/{fullname}-leader-election",
            f"rolebinding.rbac.authorization.k8s.io/{fullname}-leader-election",
            f"serviceaccount/{fullname}",
            # NetworkPolicy is on by default: the operator, the nodes and Redis, the router.
            f"networkpolicy.networking.k8s.io/{fullname}",
            f"networkpolicy.networking.k8s.io/{fullname}-nodes",
            f"networkpolicy.networking.k8s.io/{fullname}-router",
        ]
    )
    deployment = cluster.get("deployment", fullname)
    assert deployment["status"].get("readyReplicas") == 1
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][:2] == ["operator", f"--namespace={cluster.namespace}"]
    assert f"--lease-name={fullname}" in container["args"]

    cluster.kube.helm(
        "upgrade", release, str(CHART), ns, "--wait", "--timeout=120s",
        *set_flags(("operator.replicas=2", "operator.resyncSeconds=30", "redis.enabled=true", "exampleCluster.enabled=true")),
    )  # fmt: skip
    deployment = cluster.get("deployment", fullname)
    assert deployment["spec"]["replicas"] == 2 and deployment["status"].get("readyReplicas") == 2
    assert "--resync-seconds=30" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert cluster.get("deployment", f"{fullname}-redis") is not None
    example = cluster.get("inferencecluster", "example")
    assert example["spec"]["redis"]["url"] == f"redis://{fullname}-redis.{cluster.namespace}.svc:6379/0"
    # The shared Redis requires a password the chart made; the example's pods get it from the same Secret.
    assert example["spec"]["redis"]["passwordSecret"] == {"name": f"{fullname}-redis", "key": "password"}
    [redis] = cluster.get("deployment", f"{fullname}-redis")["spec"]["template"]["spec"]["containers"]
    assert redis["args"][2:4] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert redis["env"][0]["valueFrom"]["secretKeyRef"] == {"name": f"{fullname}-redis", "key": "password"}
    password = cluster.get("secret", f"{fullname}-redis")["data"]["password"]
    assert len(base64.b64decode(password)) == 32
    # The operator's signing seed (internal TLS certificates), from a Secret the chart made.
    [seed_env] = [var for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
                  if var["name"] == "KVFERRY_SIGNING_SEED"]
    assert seed_env["valueFrom"]["secretKeyRef"] == {"name": f"{fullname}-signing-seed", "key": "seed"}
    seed = cluster.get("secret", f"{fullname}-signing-seed")["data"]["seed"]
    assert len(base64.b64decode(seed)) == 48
    cluster.kube.helm("upgrade", release, str(CHART), ns, "--reuse-values", "--wait", "--timeout=120s")
    assert cluster.get("secret", f"{fullname}-redis")["data"]["password"] == password  # kept, not made again
    assert cluster.get("secret", f"{fullname}-signing-seed")["data"]["seed"] == seed  # every cluster's CA kept

    cluster.kube.helm("uninstall", release, ns, "--wait", "--timeout=120s")
    cluster.wait("release objects removed", lambda: release_objects(cluster) == [], 60)
    assert cluster.get("inferencecluster", "example") is None
    assert cluster.kube.kubectl("get", "crd", CRD, check=False).returncode == 0  # helm keeps CRDs by design


def test_chart_rbac_is_enough_and_no_more(cluster: Cluster, start_operator, tmp_path: Path) -> None:
    ns = cluster.namespace
    release, fullname = release_of(cluster)
    cluster.kube.helm("install", release, str(CHART), f"--namespace={ns}")  # defaults: its own namespace
    account = f"system:serviceaccount:{ns}:{fullname}"

    def can(verb: str, resource: str, *extra: str) -> bool:
        answer = cluster.kubectl("auth", "can-i", verb, resource, *extra, f"--as={account}", check=False)
        return answer.stdout.strip() == "yes"

    # The apiserver authorizes from a cache of Roles and bindings that a loaded machine fills a moment
    # after helm returns: wait until both Roles are in force, or the operator's first calls are refused.
    cluster.wait(
        "the chart's Roles to be in force",
        lambda: (
            can("patch", "inferenceclusters", "--subresource=status") and can("update", f"leases/{fullname}")
        ),
        60,
    )
    for verb, resource in (
        ("get", "secrets"),
        ("list", "nodes"),
        ("create", "pods"),
        ("delete", "inferenceclusters"),
        ("update", "leases/someone-elses"),
    ):
        assert not can(verb, resource), f"the operator may {verb} {resource}"
    # Nothing in another namespace, or across them all.
    for verb, resource in (("create", "deployments"), ("patch", "inferenceclusters"), ("create", "secrets"),
                           ("list", "pods")):
        assert not can(verb, resource, "--namespace=kube-system"), f"the operator may {verb} {resource} elsewhere"
        assert not can(verb, resource, "--all-namespaces"), f"the operator may {verb} {resource} everywhere"
    # Each cluster's own token and Redis password, and its internal TLS Secret, rewritten at each rotation
    # from the signing seed: none of them read back (get is refused above).
    assert can("create", "secrets") and can("patch", "secrets")

    # Run the operator with the chart's ServiceAccount token instead of the admin certificate.
    token = cluster.kubectl("create", "token", fullname, "--duration=1h").stdout.strip()
    admin = json.loads(Path(cluster.kube.kubeconfig).read_text())
    kubeconfig = tmp_path / "operator.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                **admin,
                "users": [{"name": "user", "user": {"token": token}}],
            }
        )
    )
    operator = start_operator(f"--lease-name={fullname}", kubeconfig=str(kubeconfig))
    cluster.apply(EXAMPLE.read_text())
    status = cluster.wait_phase(NAME, "Ready")
    assert status["decode"]["ready"] == 1
    # Every refusal reads "forbidden" (kopf, the client's ApiException, the lease's warning); a bare
    # "403" would also match the milliseconds of a log line's timestamp.
    assert "forbidden" not in operator.log().lower(), operator.log()
    cluster.kube.helm("uninstall", release, f"--namespace={ns}", "--wait")
