"""The router's configuration: flags over a file, the operator's cluster.json read as it is written,
custom policies, and mistakes refused at start-up."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from kvferry.operator.build_config import build_cluster_config
from kvferry.operator.naming import ClusterRef
from kvferry.operator.validation import parse_spec
from kvferry.router.config import load_config


def test_the_operators_cluster_json_configures_model_redis_and_kubernetes_discovery(tmp_path):
    spec = parse_spec({"model": {"source": "pvc://weights/tiny", "servedName": "tiny"}, "redis": {"url": "redis://r:6379/0"}})
    cluster = build_cluster_config(ClusterRef("demo", "serving", "uid-1"), spec)
    path = tmp_path / "cluster.json"
    path.write_text(cluster.to_json())
    config = load_config(None, {"policy": "prefix"}, cluster_config=path)
    assert config.served_model_name == "tiny" and config.model.path == cluster.model.path
    assert config.redis.url == "redis://r:6379/0" and config.registry_url == "redis://r:6379/0"
    assert config.discovery.mode == "kubernetes" and config.discovery.namespace == "serving"
    assert config.discovery.selectors["decode"] == {"kvferry.dev/cluster": "demo", "kvferry.dev/role": "decode"}
    assert config.resolve_policy().name == "prefix"


def test_a_router_file_goes_over_the_cluster_config_and_flags_over_both(tmp_path):
    spec = parse_spec({"model": {"source": "/models/tiny", "servedName": "tiny"}})
    cluster = tmp_path / "cluster.json"
    cluster.write_text(build_cluster_config(ClusterRef("demo", "serving", "uid-1"), spec).to_json())
    router_file = tmp_path / "router.yaml"
    router_file.write_text(yaml.safe_dump({"max_inflight": 8, "discovery": {"port": 9000}}))
    config = load_config(router_file, {"discovery": {"namespace": "elsewhere"}}, cluster_config=cluster)
    assert (config.max_inflight, config.discovery.port, config.discovery.namespace) == (8, 9000, "elsewhere")
    assert config.discovery.mode == "kubernetes" and config.served_model_name == "tiny"


def test_flags_override_the_file_and_unset_flags_leave_it(tmp_path):
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"path": "/models/llama", "served_name": "llama-3"},
        "discovery": {"prefill": ["http://p0:1"], "decode": ["http://d0:1"]},
        "policy": "cache_first",
        "policies": {"cache_first": {"prefill": {"prefix_hit": 4, "queue_depth": 1}, "decode": {"kv_pressure": 1}}},
        "max_inflight": 8,
    }))
    config = load_config(path, {"model": {"path": None, "served_name": None}, "discovery": {"decode": ["http://d9:1"]},
                                "max_inflight": None})
    assert (config.model.path, config.served_model_name, config.max_inflight) == ("/models/llama", "llama-3", 8)
    assert (config.discovery.prefill, config.discovery.decode) == (["http://p0:1"], ["http://d9:1"])
    policy = config.resolve_policy()
    assert (policy.name, dict(policy.prefill), dict(policy.decode)) == ("cache_first", {"prefix_hit": 4, "queue_depth": 1},
                                                                         {"kv_pressure": 1})


def test_mistakes_stop_the_router_at_start(tmp_path):
    with pytest.raises(ValidationError, match="unknown policy"):
        load_config(None, {"model": {"path": "/m"}, "policy": "fastest"})
    with pytest.raises(ValidationError, match="unknown scorers"):
        load_config(None, {"model": {"path": "/m"}, "policy": "p", "policies": {"p": {"prefill": {"magic": 1}}}})
    with pytest.raises(ValidationError, match="max_inflight"):
        load_config(None, {"model": {"path": "/m"}, "max_inflight": 0})
    path = tmp_path / "typo.yaml"
    path.write_text("model: {path: /m}\nmax_inflite: 3\n")
    with pytest.raises(ValidationError, match="max_inflite"):
        load_config(path, {})
