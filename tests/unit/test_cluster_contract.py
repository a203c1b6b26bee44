"""The cluster contract, end to end without a cluster: the operator's real pod specs (pure builders) are
run through the real `kvferry` entry points' parsing and validation, as a kubelet would start them: the
ConfigMap's file where the pod mounts it, downward-API variables filled in per pod and `$(VAR)` expanded
in the arguments. Then the nodes and the router must agree: every node its own name, a URL at its pod's
IP that the router's discovery builds too, one served-model name (the prefix-index keys' salt)."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from cryptography import x509

from kvferry.cli import build_parser, main
from kvferry.cli.serve import router_config_from
from kvferry.node.config import NodeConfig, node_config_from, node_url
from kvferry.node.runtime import engine_args_from
from kvferry.operator.children import build_children
from kvferry.operator.internal_tls import build_internal_tls_secrets
from kvferry.operator.naming import ClusterRef
from kvferry.operator.validation import parse_spec
from kvferry.router.config import RouterConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "inferencecluster.yaml").read_text())
REF = ClusterRef(name=EXAMPLE["metadata"]["name"], namespace="serving", uid="0000-1111")
CREATED = datetime(2026, 1, 1, tzinfo=UTC)
# Variables the entry points read from the environment: the test's own must not leak into the pods'.
ENTRY_POINT_ENV = ("KVFERRY_CLUSTER_TOKEN", "KVFERRY_API_KEY", "KVFERRY_API_KEYS", "POD_NAME", "POD_IP")


def gpu_variant() -> dict[str, Any]:
    gpu = {"requests": {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": 1}, "limits": {"memory": "32Gi"}}
    return {
        **EXAMPLE["spec"],
        "model": {**EXAMPLE["spec"]["model"], "quantization": "fp8"},
        "prefill": {"replicas": 2, "resources": gpu},
        "decode": {"replicas": 2, "resources": gpu},
        "clusterTokenSecret": {"name": "internal"},
        "authSecret": {"name": "api-keys"},
    }


SPECS = {"example": EXAMPLE["spec"], "two-replicas-gpu": gpu_variant(),
         "internal-tls": {**EXAMPLE["spec"], "internalTls": {"mode": "selfSigned"}}}


class FakePod:
    """One replica of a Deployment as the kubelet starts it: name, IP, env and mounted files."""

    def __init__(self, deployment: dict[str, Any], index: int, ip: str, objects: dict[str, dict], root: Path):
        self.template = deployment["spec"]["template"]
        self.name = f"{deployment['metadata']['name']}-6c9d8f7b5-{index:05d}"
        self.ip = ip
        [self.container] = self.template["spec"]["containers"]
        self.env = {var["name"]: self._value(var) for var in self.container["env"]}
        self.mounts = self._mount_volumes(objects, root / self.name)

    def _value(self, var: dict[str, Any]) -> str:
        if "value" in var:
            return var["value"]
        source = var["valueFrom"]
        if "fieldRef" in source:
            return {"metadata.name": self.name, "status.podIP": self.ip, "metadata.namespace": REF.namespace}[
                source["fieldRef"]["fieldPath"]
            ]
        secret = source["secretKeyRef"]
        return f"secret:{secret['name']}/{secret['key']}"

    def _mount_volumes(self, objects: dict[str, dict], root: Path) -> dict[str, Path]:
        """ConfigMaps and Secrets (`objects`, by name) with their files; a Secret the operator does not write
        (the user's) with a placeholder in each file its items name."""
        volumes = {volume["name"]: volume for volume in self.template["spec"]["volumes"]}
        mounts = {}
        for mount in self.container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                files = {name: text.encode() for name, text in objects[volume["configMap"]["name"]]["data"].items()}
            elif "secret" in volume:
                name = volume["secret"]["secretName"]
                data = objects.get(name, {}).get("data", {})
                files = {item["path"]: base64.b64decode(data[item["key"]]) if item["key"] in data
                         else f"secret:{name}/{item['key']}".encode() for item in volume["secret"].get("items", [])}
            else:
                continue
            folder = root / mount["mountPath"].lstrip("/")
            folder.mkdir(parents=True)
            for file_name, content in files.items():
                (folder / file_name).write_bytes(content)
            mounts[mount["mountPath"]] = folder
        return mounts

    def argv(self) -> list[str]:
        """command + args after the kubelet's $(VAR) expansion, with mounted paths pointing at the files."""
        expanded = [self._expand(arg) for arg in self.container["command"] + self.container["args"]]
        return [self._local_path(arg) for arg in expanded]

    def _expand(self, text: str) -> str:
        # Kubernetes expands $(NAME) from the container's env, leaves an unknown one as written, $$ is a $.
        return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                      lambda m: "$" if m[0] == "$$" else self.env.get(m[1], m[0]), text)

    def _local_path(self, arg: str) -> str:
        for mount_path, folder in self.mounts.items():
            if arg.startswith(mount_path + "/"):
                return str(folder / arg.removeprefix(mount_path + "/"))
        return arg


def start(pod: FakePod, monkeypatch: pytest.MonkeyPatch) -> NodeConfig | RouterConfig:
    """What `kvferry <role>` resolves before it serves: the real parser, then the role's real config."""
    command, *argv = pod.argv()
    assert command == "kvferry"  # the console script, whose entry point is kvferry.cli.main
    with monkeypatch.context() as patch:
        for name in ENTRY_POINT_ENV:
            patch.delenv(name, raising=False)
        for name, value in pod.env.items():
            patch.setenv(name, value)
        args = build_parser().parse_args(argv)
        if args.command == "router":
            return router_config_from(args)
        return node_config_from(args, args.command)


def started_pods(spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple]]:
    parsed = parse_spec(spec)
    # What a reconcile writes besides the children: the internal TLS Secret, from a seed as the chart's.
    secrets = build_internal_tls_secrets(REF, parsed, b"contract-test-signing-seed-0123456789", CREATED, CREATED)
    children = build_children(REF, parsed, {})
    objects = {c["metadata"]["name"]: c for c in [*children, *secrets] if c["kind"] in ("ConfigMap", "Secret")}
    pods: dict[str, list[tuple]] = {}
    for subnet, deployment in enumerate(c for c in children if c["kind"] == "Deployment"):
        role = deployment["metadata"]["labels"]["kvferry.dev/role"]
        if role == "redis":
            continue
        for index in range(deployment["spec"]["replicas"]):
            pod = FakePod(deployment, index, f"10.244.{subnet}.{index + 10}", objects, tmp_path)
            pods.setdefault(role, []).append((pod, start(pod, monkeypatch)))
    return pods


@pytest.mark.parametrize("variant", sorted(SPECS))
def test_the_operators_pods_start_and_agree(variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS[variant]
    pods = started_pods(spec, tmp_path, monkeypatch)
    routers = [config for _, config in pods["router"]]
    assert len(routers) == 2 and all(isinstance(router, RouterConfig) for router in routers)  # the default
    router = routers[0]
    nodes = [(pod, config) for role in ("prefill", "decode") for pod, config in pods[role]]
    assert [len(pods[role]) for role in ("prefill", "decode")] == [spec["prefill"]["replicas"], spec["decode"]["replicas"]]

    # Every replica registers apart, under its pod's name.
    names = [config.name for _, config in nodes]
    assert len(set(names)) == len(names)
    assert names == [pod.name for pod, _ in nodes]
    # Its published URL is its pod IP's, exactly as the router's discovery builds it from the pod.
    discovery = router.discovery
    assert discovery.mode == "kubernetes" and discovery.namespace == REF.namespace
    scheme = "https" if "internalTls" in spec else "http"
    assert router.node_scheme == scheme
    if router.internal_tls is not None:  # the name the router checks is the nodes' certificate's, from its CA
        ca = x509.load_pem_x509_certificate(Path(router.internal_tls.ca_file).read_bytes())
        for _, config in nodes:
            assert config.tls_cert_file is not None
            cert = x509.load_pem_x509_certificate(Path(config.tls_cert_file).read_bytes())
            cert.verify_directly_issued_by(ca)
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert router.internal_tls.server_name in names.get_values_for_type(x509.DNSName)
    for pod, config in nodes:
        assert config.url == node_url(pod.ip, discovery.port, router.node_scheme) == f"{scheme}://{pod.ip}:{discovery.port}"
        assert {"name": "http", "containerPort": config.port, "protocol": "TCP"} in pod.container["ports"]
        labels = pod.template["metadata"]["labels"]
        assert discovery.selectors[config.role].items() <= labels.items()  # the router watches this pod
    # One model under one name: the nodes salt their block hashes with it, the router keys the index by it.
    served = {config.served_model_name for _, config in nodes} | {router.served_model_name}
    assert served == {spec["model"]["servedName"]}
    assert {engine_args_from(config).served_model_name for _, config in nodes} == served
    assert {config.model for _, config in nodes} == {router.model.path}
    # One registry: a prefill node finds the decode node's transfer address where the decode node put it.
    assert {config.registry for _, config in nodes} == {router.registry_url}
    assert router.registry_url.startswith("redis://")
    if spec["redis"].get("managed"):  # the password from the operator's Secret, in every URL and not in the file
        assert unquote(urlsplit(router.registry_url).password or "") == f"secret:{REF.name}-internal/redis-password"
        [config_map] = [c for c in build_children(REF, parse_spec(spec), {}) if c["kind"] == "ConfigMap"]
        assert urlsplit(json.loads(config_map["data"]["cluster.json"])["redis"]["url"]).password is None
    # The KV and transfer settings of the resource reach every node's engine.
    kv = spec["kvCache"]
    for _, config in nodes:
        engine = engine_args_from(config)
        assert (engine.block_size, engine.gpu_memory_fraction, engine.dtype) == (
            kv["blockSize"], kv["memoryFraction"], kv["dtype"])
        assert engine.quantization == spec["model"].get("quantization")
        assert config.ucx_transports == tuple(spec["transfer"]["ucxTransports"])


def test_gpu_nodes_get_gpus_and_the_token_and_the_router_its_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pods = started_pods(SPECS["two-replicas-gpu"], tmp_path, monkeypatch)
    for role in ("prefill", "decode"):
        for pod, config in pods[role]:
            assert pod.container["resources"]["limits"]["nvidia.com/gpu"] == 1
            assert config.cluster_token == "secret:internal/cluster-token"
    for router_pod, router in pods["router"]:
        assert "nvidia.com/gpu" not in router_pod.container.get("resources", {}).get("limits", {})
        assert "secret:api-keys/api-key" in router.api_keys


def write_cluster_config(tmp_path: Path, **changes: Any) -> Path:
    [config_map] = [c for c in build_children(REF, parse_spec(EXAMPLE["spec"]), {}) if c["kind"] == "ConfigMap"]
    document = json.loads(config_map["data"]["cluster.json"])
    for section, fields in changes.items():
        document[section] = {**document[section], **fields}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("role", ["prefill", "decode", "router"])
def test_an_unknown_field_stops_every_role_naming_the_field_and_the_file(role: str, tmp_path: Path) -> None:
    path = write_cluster_config(tmp_path, kvCache={"blockSiz": 32})
    with pytest.raises(SystemExit) as stopped:
        main([role, "--config", str(path)])
    message = str(stopped.value)
    assert str(path) in message and "kvCache.blockSiz" in message and "Extra inputs are not permitted" in message


def test_a_missing_section_is_named_too(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"model": {"path": "/models", "servedName": "tiny"}}))
    with pytest.raises(SystemExit, match=r"cluster.json: kvCache: Field required"):
        main(["router", "--config", str(path)])


def test_flags_override_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_cluster_config(tmp_path, redis={"url": "redis://from-file:6379/0"})
    monkeypatch.delenv("KVFERRY_CLUSTER_TOKEN", raising=False)
    parser = build_parser()
    node = node_config_from(parser.parse_args([
        "decode", "--config", str(path), "--name", "d", "--advertise-host", "10.0.0.1", "--host", "0.0.0.0",
        "--served-model-name", "other", "--block-size", "32", "--registry", "redis://flag:6379/0",
    ]), "decode")
    assert (node.served_model_name, node.block_size, node.registry) == ("other", 32, "redis://flag:6379/0")
    assert node.gpu_memory_fraction == EXAMPLE["spec"]["kvCache"]["memoryFraction"]  # not given: the file's
    router = router_config_from(parser.parse_args([
        "router", "--config", str(path), "--served-model-name", "other", "--redis-url", "redis://flag:6379/0",
        "--node-port", "9000",
    ]))
    assert (router.served_model_name, router.redis.url, router.discovery.port) == ("other", "redis://flag:6379/0", 9000)
    assert router.discovery.selectors["decode"]["kvferry.dev/cluster"] == REF.name  # not given: the file's
