"""Node flags reach the engine: device selection per node (a prefill node on one GPU, decode on another)."""

from __future__ import annotations

import argparse

import pytest

from kvferry.node_config import add_node_arguments, node_config_from
from kvferry.node_runtime import engine_args_from


def _config(role: str, *flags: str):
    parser = argparse.ArgumentParser()
    add_node_arguments(parser, role)
    return node_config_from(parser.parse_args(["--model", "/m", "--registry", "memory://", *flags]), role)


def test_each_node_gets_its_own_device_and_batch_limits():
    prefill = engine_args_from(_config("prefill", "--device", "cuda:0", "--max-num-batched-tokens", "512"))
    decode = engine_args_from(_config("decode", "--device", "cuda:1", "--max-num-seqs", "256"))
    assert (prefill.device, prefill.max_num_batched_tokens) == ("cuda:0", 512)
    assert (decode.device, decode.max_num_seqs) == ("cuda:1", 256)
    assert str(prefill.resolve_device()) == "cuda:0" and str(decode.resolve_device()) == "cuda:1"


def test_two_nodes_share_one_gpu_by_memory_fraction_or_explicit_pool():
    prefill = engine_args_from(_config("prefill", "--device", "cuda", "--gpu-memory-fraction", "0.45"))
    decode = engine_args_from(_config("decode", "--device", "cuda", "--kv-cache-bytes", str(8 << 30)))
    assert prefill.gpu_memory_fraction == 0.45 and prefill.kv_cache_bytes is None
    assert decode.kv_cache_bytes == 8 << 30
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        engine_args_from(_config("decode", "--gpu-memory-fraction", "1.5"))


def test_defaults_pick_the_device_by_availability():
    args = engine_args_from(_config("decode"))
    assert args.device == "auto" and args.max_num_seqs == 64


def test_bad_limits_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine_args_from(_config("decode", "--max-num-seqs", "0"))
