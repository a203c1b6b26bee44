"""Node flags reach the engine: device selection per node (a prefill node on one GPU, decode on another)."""

from __future__ import annotations

import argparse

import pytest

from kvferry.engine.devices import resolve_device
from kvferry.node.config import NodeConfig, add_node_arguments, node_config_from, transfer_environment
from kvferry.node.runtime import engine_args_from


def _config(role: str, *flags: str):
    parser = argparse.ArgumentParser()
    add_node_arguments(parser, role)
    return node_config_from(parser.parse_args(["--model", "/m", "--registry", "memory://", *flags]), role)


def test_each_node_gets_its_own_device_and_batch_limits():
    prefill = engine_args_from(_config("prefill", "--device", "cuda:0", "--max-num-batched-tokens", "512"))
    decode = engine_args_from(_config("decode", "--device", "cuda:1", "--max-num-seqs", "256"))
    assert (prefill.device, prefill.max_num_batched_tokens) == ("cuda:0", 512)
    assert (decode.device, decode.max_num_seqs) == ("cuda:1", 256)
    # On a two-GPU host (resolution checks the index against the GPUs this process sees: tests/unit/test_devices.py)
    assert [str(resolve_device(args.device, cuda_count=2)) for args in (prefill, decode)] == ["cuda:0", "cuda:1"]


def test_two_nodes_share_one_gpu_by_memory_fraction_or_explicit_pool():
    prefill = engine_args_from(_config("prefill", "--device", "cuda", "--gpu-memory-fraction", "0.45"))
    decode = engine_args_from(_config("decode", "--device", "cuda", "--kv-cache-bytes", str(8 << 30)))
    assert prefill.gpu_memory_fraction == 0.45 and prefill.kv_cache_bytes is None
    assert decode.kv_cache_bytes == 8 << 30
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        engine_args_from(_config("decode", "--gpu-memory-fraction", "1.5"))


def test_defaults_pick_the_device_by_availability():
    args = engine_args_from(_config("decode"))
    assert args.device == "auto" and args.max_num_seqs == 64 and args.quantization is None


def test_weight_formats_are_a_node_flag():
    assert engine_args_from(_config("decode", "--quantization", "fp8")).quantization == "fp8"
    assert engine_args_from(_config("decode", "--quantization", "int4")).quantization == "int4"
    with pytest.raises(SystemExit):  # argparse names the choices
        _config("decode", "--quantization", "int2")


def test_bad_limits_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine_args_from(_config("decode", "--max-num-seqs", "0"))


def test_cluster_token_comes_from_its_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("KVFERRY_CLUSTER_TOKEN", raising=False)
    assert _config("decode").cluster_token is None  # no token: the internal API is open
    monkeypatch.setenv("KVFERRY_CLUSTER_TOKEN", "from-env")
    assert _config("decode").cluster_token == "from-env"
    secret = tmp_path / "cluster-token"
    secret.write_text("from-secret\n")  # a mounted Secret's trailing newline is not part of the token
    config = _config("prefill", "--cluster-token-file", str(secret))
    assert config.cluster_token == "from-secret"
    assert "from-secret" not in repr(config)  # a logged config does not leak it
    secret.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        _config("prefill", "--cluster-token-file", str(secret))


@pytest.mark.parametrize(
    ("host", "environment"),
    [("127.0.0.1", {"UCX_NET_DEVICES": "lo"}), ("127.0.0.2", {"UCX_NET_DEVICES": "lo"}), ("::1", {"UCX_NET_DEVICES": "lo"}),
     ("localhost", {"UCX_NET_DEVICES": "lo"}), ("0.0.0.0", {}), ("10.1.2.3", {}), ("node-0.svc", {})],
)
def test_a_loopback_node_keeps_ucx_on_loopback(host, environment):
    config = NodeConfig("decode", "d", "/m", host=host, advertise_host="10.1.2.3")
    assert transfer_environment(config) == environment


def test_ucx_transports_become_ucx_tls():
    config = NodeConfig("decode", "d", "/m", host="0.0.0.0", advertise_host="10.1.2.3", ucx_transports=("tcp", "sm"))
    assert transfer_environment(config) == {"UCX_TLS": "tcp,sm"}


def test_the_published_url_is_the_advertised_address():
    assert _config("decode", "--port", "9000").url == "http://127.0.0.1:9000"
    assert _config("decode", "--host", "0.0.0.0", "--advertise-host", "10.244.0.7").url == "http://10.244.0.7:8100"
    assert _config("decode", "--host", "::", "--advertise-host", "fd00::7").url == "http://[fd00::7]:8100"
    # Listening everywhere names no address to publish; a pod whose IP variable is missing is refused too.
    with pytest.raises(ValueError, match="--advertise-host"):
        _config("decode", "--host", "0.0.0.0")
    with pytest.raises(ValueError, match="never expanded"):
        _config("decode", "--host", "0.0.0.0", "--advertise-host", "$(POD_IP)")


def test_a_node_needs_a_model_and_falls_back_to_a_process_registry():
    parser = argparse.ArgumentParser()
    add_node_arguments(parser, "decode")
    with pytest.raises(ValueError, match="needs a model"):
        node_config_from(parser.parse_args([]), "decode")
    assert node_config_from(parser.parse_args(["--model", "/m"]), "decode").registry == "memory://"
