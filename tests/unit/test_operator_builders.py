"""The pure manifest builders: exact fields of every child an InferenceCluster gets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvferry.operator.build_config import build_config_map, config_hash
from kvferry.operator.build_rbac import build_router_role, build_router_role_binding
from kvferry.operator.build_redis import build_redis_deployment, build_redis_service
from kvferry.operator.build_services import build_node_service, build_router_service, router_endpoint
from kvferry.operator.build_workloads import build_role_deployment
from kvferry.operator.children import CHILD_KINDS, build_children
from kvferry.operator.naming import ClusterRef
from kvferry.operator.replica_counts import desired_replicas
from kvferry.operator.validation import InvalidSpec, parse_spec

REF = ClusterRef(name="demo", namespace="serving", uid="0000-1111")
OWNER = {
    "apiVersion": "kvferry.dev/v1alpha1",
    "kind": "InferenceCluster",
    "name": "demo",
    "uid": "0000-1111",
    "controller": True,
    "blockOwnerDeletion": True,
}
SECURE_CONTAINER = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def spec(**overrides: Any):
    return parse_spec({"model": {"source": "pvc://weights/tiny", "servedName": "tiny"}, **overrides})


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only


def test_children_are_one_of_each_kind_in_dependency_order() -> None:
    children = build_children(REF, spec(), {})
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("ServiceAccount", "demo-router"),
        ("Role", "demo-router"),
        ("RoleBinding", "demo-router"),
        ("ConfigMap", "demo-config"),
        ("Service", "demo-prefill"),
        ("Service", "demo-decode"),
        ("Service", "demo-router"),
        ("PodDisruptionBudget", "demo-prefill"),
        ("PodDisruptionBudget", "demo-decode"),
        ("PodDisruptionBudget", "demo-router"),
        ("Deployment", "demo-prefill"),
        ("Deployment", "demo-decode"),
        ("Deployment", "demo-router"),
    ]
    assert {(c["apiVersion"], c["kind"]) for c in children} <= set(CHILD_KINDS)
    for child in children:
        assert child["metadata"]["namespace"] == "serving"
        assert child["metadata"]["ownerReferences"] == [OWNER]
        assert child["metadata"]["labels"]["kvferry.dev/cluster"] == "demo"
        assert child["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kvferry-operator"


def test_managed_redis_adds_its_deployment_and_service() -> None:
    names = [(c["kind"], c["metadata"]["name"]) for c in build_children(REF, spec(redis={"managed": True}), {})]
    assert ("Deployment", "demo-redis") in names and ("Service", "demo-redis") in names


def test_prefill_deployment() -> None:
    s = spec(
        image="registry.local/kvferry:1.2",
        prefill={
            "replicas": 3,
            "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "40Gi"}},
            "env": [{"name": "POD_IP", "value": "overridden"}, {"name": "EXTRA", "value": "1"}],
            "nodeSelector": {"gpu": "h200"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        transfer={"ucxTransports": ["cuda_ipc", "rc"]},
    )
    deployment = build_role_deployment(REF, s, "prefill", "abc123", desired_replicas(s, {})["prefill"])
    assert deployment["metadata"]["labels"] == {
        "app.kubernetes.io/name": "kvferry",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/component": "prefill",
        "app.kubernetes.io/part-of": "kvferry",
        "app.kubernetes.io/managed-by": "kvferry-operator",
        "kvferry.dev/cluster": "demo",
        "kvferry.dev/role": "prefill",
    }
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"] == {
        "matchLabels": {"kvferry.dev/cluster": "demo", "kvferry.dev/role": "prefill"}
    }
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"] == {"kvferry.dev/config-hash": "abc123"}
    pod = template["spec"]
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "affinity" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = container(deployment)
    assert c["image"] == "registry.local/kvferry:1.2"
    # What the command means is tests/unit/test_cluster_contract.py's business: it runs the real parser.
    assert c["command"] == ["kvferry"] and c["args"][0] == "prefill"
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 1, "memory": "40Gi"}}
    env = {var["name"]: var for var in c["env"]}
    assert list(env) == ["POD_NAME", "POD_IP", "KVFERRY_CLUSTER_TOKEN", "KVFERRY_LOG_LEVEL", "KVFERRY_LOG_FORMAT", "EXTRA"]
    assert (env["KVFERRY_LOG_LEVEL"]["value"], env["KVFERRY_LOG_FORMAT"]["value"]) == ("warning", "text")
    # No clusterTokenSecret: the token the operator made (internal_secret.py).
    assert env["KVFERRY_CLUSTER_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "demo-internal", "key": "cluster-token"}}
    assert env["POD_NAME"] == {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert env["POD_IP"] == {"name": "POD_IP", "value": "overridden"}
    assert c["securityContext"] == SECURE_CONTAINER
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]} == {
        "/etc/kvferry": True,
        "/tmp": False,
        "/dev/shm": False,
        "/models": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"] == {"name": "config", "configMap": {"name": "demo-config"}}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}


def test_router_deployment_uses_its_service_account_and_api_key_secret() -> None:
    s = spec(authSecret={"name": "api-keys"}, router={"affinity": {"nodeAffinity": {"x": 1}}})
    deployment = build_role_deployment(REF, s, "router", "h", 1)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "demo-router"
    assert "automountServiceAccountToken" not in pod
    assert pod["affinity"] == {"nodeAffinity": {"x": 1}}
    c = container(deployment)
    assert c["args"][0] == "router"
    env = {var["name"]: var for var in c["env"]}
    assert env["KVFERRY_API_KEY"] == {
        "name": "KVFERRY_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "api-keys", "key": "api-key"}},
    }
    assert "POD_IP" not in env  # the router publishes nothing about itself
    assert "/dev/shm" not in {m["mountPath"] for m in c["volumeMounts"]}


def test_every_role_gets_the_cluster_token_from_its_secret_by_env() -> None:
    s = spec(clusterTokenSecret={"name": "demo-internal"}, authSecret={"name": "api-keys"})
    expected = {
        "name": "KVFERRY_CLUSTER_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "demo-internal", "key": "cluster-token"}},
    }
    for role in ("prefill", "decode", "router"):
        c = container(build_role_deployment(REF, s, role, "h", 1))
        env = {var["name"]: var for var in c["env"]}
        assert env["KVFERRY_CLUSTER_TOKEN"] == expected, role
        # In the environment from the Secret only: never in argv, the ConfigMap or a literal value.
        assert not any("token" in arg for arg in c["args"]), role
    router_env = {var["name"] for var in container(build_role_deployment(REF, s, "router", "h", 1))["env"]}
    assert "KVFERRY_API_KEY" in router_env  # the API key still goes to the router alone
    node_env = {var["name"] for var in container(build_role_deployment(REF, s, "decode", "h", 1))["env"]}
    assert "KVFERRY_API_KEY" not in node_env
    config = build_config_map(REF, s)["data"]["cluster.json"]
    assert "demo-internal" not in config and "cluster-token" not in config


def test_cluster_token_key_can_be_chosen_and_without_a_secret_is_the_operators() -> None:
    keyed = spec(clusterTokenSecret={"name": "shared", "key": "internal"})
    env = {var["name"]: var for var in container(build_role_deployment(REF, keyed, "prefill", "h", 1))["env"]}
    assert env["KVFERRY_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "shared", "key": "internal"}
    for role in ("prefill", "decode", "router"):
        env = {var["name"]: var for var in container(build_role_deployment(REF, spec(), role, "h", 1))["env"]}
        assert env["KVFERRY_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "demo-internal",
                                                                             "key": "cluster-token"}, role


def test_a_users_env_var_overrides_the_cluster_token_by_name() -> None:
    # The user's variables win by name (as for POD_IP); one entry, so server-side apply accepts the list.
    own = {"name": "KVFERRY_CLUSTER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mine", "key": "t"}}}
    s = spec(clusterTokenSecret={"name": "demo-internal"}, decode={"env": [own]})
    env = container(build_role_deployment(REF, s, "decode", "h", 1))["env"]
    assert [var for var in env if var["name"] == "KVFERRY_CLUSTER_TOKEN"] == [own]


def test_a_gpu_request_alone_becomes_the_limit_kubernetes_requires() -> None:
    s = spec(decode={"resources": {"requests": {"nvidia.com/gpu": 2, "cpu": "250m"}, "limits": {"memory": "8Gi"}}})
    assert container(build_role_deployment(REF, s, "decode", "h", 1))["resources"] == {
        "requests": {"nvidia.com/gpu": 2, "cpu": "250m"},
        "limits": {"nvidia.com/gpu": 2, "memory": "8Gi"},
    }
    cpu_only = spec(decode={"resources": {"requests": {"cpu": "250m"}}})
    assert container(build_role_deployment(REF, cpu_only, "decode", "h", 1))["resources"] == {"requests": {"cpu": "250m"}}


def test_image_path_source_mounts_no_model_volume() -> None:
    s = parse_spec({"model": {"source": "/opt/models/tiny", "servedName": "tiny"}})
    pod = build_role_deployment(REF, s, "decode", "h", 1)["spec"]["template"]["spec"]
    assert "model" not in {v["name"] for v in pod["volumes"]}


def test_config_map_carries_the_cluster_configuration() -> None:
    config_map = build_config_map(REF, spec(redis={"managed": True}, kvCache={"blockSize": 32}))
    assert config_map["metadata"]["name"] == "demo-config"
    document = json.loads(config_map["data"]["cluster.json"])
    assert sorted(document) == ["discovery", "kvCache", "model", "redis", "transfer"]
    assert document["model"] == {"path": "/models/tiny", "servedName": "tiny", "quantization": None}
    assert document["kvCache"] == {"blockSize": 32, "memoryFraction": 0.9, "dtype": "auto"}
    assert document["transfer"] == {"protocol": "ucx", "ucxTransports": []}
    assert document["redis"] == {"url": "redis://demo-redis.serving.svc:6379/0"}
    assert document["discovery"]["selectors"]["decode"] == {
        "kvferry.dev/cluster": "demo",
        "kvferry.dev/role": "decode",
    }
    external = json.loads(
        build_config_map(REF, spec(redis={"url": "redis://cache:6379/1"}))["data"]["cluster.json"]
    )
    assert external["redis"] == {"url": "redis://cache:6379/1"}


@pytest.mark.parametrize(
    ("change", "rolls"),
    [
        ({"kvCache": {"blockSize": 32}}, True),
        ({"kvCache": {"memoryFraction": 0.5}}, True),
        ({"transfer": {"ucxTransports": ["tcp"]}}, True),
        ({"redis": {"managed": True}}, True),
        ({"prefill": {"replicas": 5}}, False),
        ({"image": "other:tag"}, False),  # the image is in the template itself
        ({"model": {"source": "pvc://weights/tiny", "servedName": "tiny", "quantization": "fp8"}}, True),
    ],
)
def test_config_hash_follows_the_configuration(change: dict[str, Any], rolls: bool) -> None:
    before = config_hash(build_config_map(REF, spec()))
    after = config_hash(build_config_map(REF, spec(**change)))
    assert (before != after) is rolls


def test_services() -> None:
    node = build_node_service(REF, "decode")
    assert node["spec"] == {
        "clusterIP": "None",
        "selector": {"kvferry.dev/cluster": "demo", "kvferry.dev/role": "decode"},
        "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
    }
    router = build_router_service(REF, spec(router={"serviceType": "LoadBalancer", "port": 80}))
    assert router["spec"]["type"] == "LoadBalancer"
    assert router["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert router["spec"]["selector"] == {"kvferry.dev/cluster": "demo", "kvferry.dev/role": "router"}


def test_router_endpoint() -> None:
    assert router_endpoint(REF, spec(), None) == "http://demo-router.serving.svc:8000"
    balanced = spec(router={"serviceType": "LoadBalancer", "port": 80})
    assert router_endpoint(REF, balanced, {"status": {}}) == "http://demo-router.serving.svc:80"
    service = {"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}
    assert router_endpoint(REF, balanced, service) == "http://203.0.113.7:80"


def test_router_rbac_is_read_only_discovery() -> None:
    assert build_router_role(REF)["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    binding = build_router_role_binding(REF)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "demo-router",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-router", "namespace": "serving"}]


def test_redis() -> None:
    s = spec(redis={"managed": True, "image": "redis:7"})
    deployment = build_redis_deployment(REF, s)
    c = container(deployment)
    assert c["image"] == "redis:7"
    assert c["command"] == ["redis-server"] and c["args"][c["args"].index("--requirepass") + 1] == "$(KVFERRY_REDIS_PASSWORD)"
    password = {"secretKeyRef": {"name": "demo-internal", "key": "redis-password"}}
    assert c["env"] == [{"name": "KVFERRY_REDIS_PASSWORD", "valueFrom": password}]
    # Every pod that talks to it has the password.
    for child in build_children(REF, s, {}):
        if child["kind"] == "Deployment" and child["metadata"]["name"] != "demo-redis":
            env = {var["name"]: var for var in container(child)["env"]}
            assert env["KVFERRY_REDIS_PASSWORD"]["valueFrom"] == password
    assert c["securityContext"] == SECURE_CONTAINER
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 999
    assert build_redis_service(REF)["spec"]["ports"] == [
        {"name": "redis", "port": 6379, "targetPort": "redis"}
    ]


def test_managed_redis_runs_from_the_clusters_image_by_default() -> None:
    # Where no registry is reachable, the image the nodes run is the one image there is.
    s = spec(image="localhost/kvferry:0.1.0", redis={"managed": True})
    assert container(build_redis_deployment(REF, s))["image"] == "localhost/kvferry:0.1.0"


@pytest.mark.parametrize(("decided", "expected"), [({}, 2), ({"decode": 4}, 4), ({"decode": 9}, 5), ({"decode": 1}, 2)])
def test_an_autoscaled_deployment_runs_the_planners_count_within_the_bounds(decided, expected) -> None:
    s = spec(decode={"replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 5, "itlP90Seconds": 0.05}},
             prefill={"replicas": 3})
    deployments = {c["metadata"]["name"]: c for c in build_children(REF, s, decided) if c["kind"] == "Deployment"}
    assert deployments["demo-decode"]["spec"]["replicas"] == expected
    assert deployments["demo-prefill"]["spec"]["replicas"] == 3  # no autoscaling: the spec's count


def test_a_role_scaled_externally_leaves_the_count_to_its_deployment() -> None:
    """Server-side apply without replicas: what an HPA set through /scale is neither owned nor reset."""
    s = spec(prefill={"replicas": 3, "scaleExternally": True}, router={"replicas": 2, "scaleExternally": True})
    deployments = {c["metadata"]["name"]: c["spec"] for c in build_children(REF, s, {}) if c["kind"] == "Deployment"}
    assert "replicas" not in deployments["demo-prefill"] and "replicas" not in deployments["demo-router"]
    assert deployments["demo-decode"]["replicas"] == 1


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_autoscaling_and_scaling_externally_exclude_each_other(role: str) -> None:
    target = {"prefill": {"ttftP90Seconds": 1.0}, "decode": {"itlP90Seconds": 0.05}}[role]
    with pytest.raises(InvalidSpec, match="autoscaling and scaleExternally both set the pod count"):
        spec(**{role: {"scaleExternally": True, "autoscaling": {"maxReplicas": 4, **target}}})


def test_a_roles_pods_spread_over_nodes_and_zones_unless_the_spec_says_otherwise() -> None:
    zone_only = [{"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
                  "labelSelector": {"matchLabels": {"team": "a"}}}]
    s = spec(decode={"topologySpreadConstraints": zone_only}, prefill={"topologySpreadConstraints": []})
    pods = {c["metadata"]["name"]: c["spec"]["template"]["spec"] for c in build_children(REF, s, {})
            if c["kind"] == "Deployment"}
    router = pods["demo-router"]["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["maxSkew"], c["whenUnsatisfiable"]) for c in router] == [
        ("kubernetes.io/hostname", 1, "ScheduleAnyway"), ("topology.kubernetes.io/zone", 1, "ScheduleAnyway")]
    assert all(c["labelSelector"] == {"matchLabels": {"kvferry.dev/cluster": "demo", "kvferry.dev/role": "router"}}
               for c in router)
    assert pods["demo-decode"]["topologySpreadConstraints"] == zone_only
    assert "topologySpreadConstraints" not in pods["demo-prefill"]


def test_a_pod_told_to_stop_drains_for_the_specs_seconds() -> None:
    """preStop's sleep, then --shutdown-grace for the requests in flight, inside the termination grace."""
    s = spec(decode={"drainSeconds": 120})
    deployments = {c["metadata"]["name"]: c for c in build_children(REF, s, {}) if c["kind"] == "Deployment"}
    for role, drain in (("decode", 120), ("prefill", 30), ("router", 30)):
        pod = deployments[f"demo-{role}"]["spec"]["template"]["spec"]
        c = container(deployments[f"demo-{role}"])
        args = c["args"]
        assert args[args.index("--shutdown-grace") + 1] == str(drain)
        hook = c["lifecycle"]["preStop"]
        if role == "router":  # its own /drain: Connection: close meanwhile, then the old streams' end
            assert hook == {"httpGet": {"path": f"/drain?seconds=3&longest={3 + drain}", "port": 8000}}
            pre_stop = 3 + drain
        else:
            pre_stop = hook["sleep"]["seconds"]
        assert 0 < pre_stop and pod["terminationGracePeriodSeconds"] > pre_stop + drain


def test_a_rollout_keeps_every_old_pod_until_its_replacement_is_ready() -> None:
    deployments = [c for c in build_children(REF, spec(rolloutDeadlineSeconds=120), {}) if c["kind"] == "Deployment"
                   and c["metadata"]["name"] != "demo-redis"]
    assert len(deployments) == 3
    for deployment in deployments:
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert deployment["spec"]["progressDeadlineSeconds"] == 120


def test_every_serving_role_has_a_disruption_budget_of_one_pod() -> None:
    budgets = {c["metadata"]["name"]: c["spec"] for c in build_children(REF, spec(), {})
               if c["kind"] == "PodDisruptionBudget"}
    assert budgets == {
        f"demo-{role}": {"maxUnavailable": 1,
                         "selector": {"matchLabels": {"kvferry.dev/cluster": "demo", "kvferry.dev/role": role}}}
        for role in ("prefill", "decode", "router")
    }


def test_the_specs_logging_reaches_every_role() -> None:
    logged = spec(logging={"level": "info", "format": "json"})
    for role in ("prefill", "decode", "router"):
        env = {var["name"]: var for var in container(build_role_deployment(REF, logged, role, "h", 1))["env"]}
        assert (env["KVFERRY_LOG_LEVEL"]["value"], env["KVFERRY_LOG_FORMAT"]["value"]) == ("info", "json"), role
    with pytest.raises(ValueError, match="format"):
        spec(logging={"format": "xml"})


def test_a_redis_url_with_a_password_secret_gives_every_role_its_password() -> None:
    shared = spec(redis={"url": "redis://kvferry-redis.serving.svc:6379/0", "passwordSecret": {"name": "kvferry-redis"}})
    for role in ("prefill", "decode", "router"):
        env = {var["name"]: var for var in container(build_role_deployment(REF, shared, role, "h", 1))["env"]}
        assert env["KVFERRY_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kvferry-redis", "key": "password"}
    open_redis = container(build_role_deployment(REF, spec(redis={"url": "redis://r:6379/0"}), "router", "h", 1))
    assert "KVFERRY_REDIS_PASSWORD" not in {var["name"] for var in open_redis["env"]}
    with pytest.raises(ValueError, match="passwordSecret"):
        spec(redis={"managed": True, "passwordSecret": {"name": "kvferry-redis"}})


def test_the_specs_tracing_reaches_every_role_and_is_absent_when_off() -> None:
    endpoint = "http://collector.observability:4318/v1/traces"
    traced = spec(tracing={"otlpEndpoint": endpoint, "sampleRatio": 0.25})
    for role in ("prefill", "decode", "router"):
        env = {var["name"]: var["value"] for var in container(build_role_deployment(REF, traced, role, "h", 1))["env"]
               if var["name"].startswith("OTEL_")}
        assert env == {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                       "OTEL_TRACES_SAMPLER_ARG": "0.25"}, role
    untraced = container(build_role_deployment(REF, spec(), "router", "h", 1))["env"]
    assert not [var for var in untraced if var["name"].startswith("OTEL_")]
    with pytest.raises(ValueError, match="otlpEndpoint"):
        spec(tracing={"otlpEndpoint": "collector:4318"})
    with pytest.raises(ValueError, match="sampleRatio"):
        spec(tracing={"otlpEndpoint": endpoint, "sampleRatio": 2})


def test_a_router_tls_secret_serves_https_with_probes_and_hook_to_match() -> None:
    s = spec(router={"tlsSecret": "router-cert"})
    deployments = {c["metadata"]["name"]: c for c in build_children(REF, s, {}) if c["kind"] == "Deployment"}
    router = deployments["demo-router"]["spec"]["template"]["spec"]
    c = container(deployments["demo-router"])
    assert c["args"][-4:] == ["--tls-cert-file", "/etc/kvferry/tls/tls.crt", "--tls-key-file", "/etc/kvferry/tls/tls.key"]
    assert {"name": "tls", "secret": {"secretName": "router-cert"}} in router["volumes"]
    assert {"name": "tls", "mountPath": "/etc/kvferry/tls", "readOnly": True} in c["volumeMounts"]
    for probe in (c["startupProbe"], c["livenessProbe"], c["readinessProbe"], c["lifecycle"]["preStop"]):
        assert probe["httpGet"]["scheme"] == "HTTPS"
    for role in ("prefill", "decode"):  # the nodes keep plain HTTP (the router is the only client)
        node = container(deployments[f"demo-{role}"])
        assert "--tls-cert-file" not in node["args"] and "scheme" not in node["readinessProbe"]["httpGet"]


@pytest.mark.parametrize("internal_tls, secret", [({"mode": "selfSigned"}, "demo-internal-tls"),
                                                  ({"mode": "secret", "secretName": "nodes-cert"}, "nodes-cert")])
def test_internal_tls_gives_the_nodes_their_key_pair_and_the_router_the_ca_alone(internal_tls, secret) -> None:
    s = spec(internalTls=internal_tls)
    deployments = {c["metadata"]["name"]: c for c in build_children(REF, s, {}) if c["kind"] == "Deployment"}
    mount = {"name": "internal-tls", "mountPath": "/etc/kvferry/internal-tls", "readOnly": True}
    for role, keys in (("prefill", ["tls.crt", "tls.key"]), ("decode", ["tls.crt", "tls.key"]), ("router", ["ca.crt"])):
        pod = deployments[f"demo-{role}"]["spec"]["template"]["spec"]
        c = container(deployments[f"demo-{role}"])
        items = [{"key": key, "path": key} for key in keys]
        assert {"name": "internal-tls", "secret": {"secretName": secret, "items": items}} in pod["volumes"]
        assert mount in c["volumeMounts"]
        scheme = c["readinessProbe"]["httpGet"].get("scheme", "HTTP")
        assert scheme == ("HTTP" if role == "router" else "HTTPS"), role  # the router's own port: tlsSecret's
    assert container(deployments["demo-decode"])["args"][-4:] == [
        "--tls-cert-file", "/etc/kvferry/internal-tls/tls.crt", "--tls-key-file", "/etc/kvferry/internal-tls/tls.key"]
    assert container(deployments["demo-router"])["args"][-4:] == [
        "--internal-ca-file", "/etc/kvferry/internal-tls/ca.crt", "--internal-server-name", "demo-nodes.serving.svc"]
