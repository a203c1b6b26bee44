"""Operator-side validation: what the schema lets through but cannot work, with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from kvferry.operator.model_source import MODEL_MOUNT_PATH, parse_model_source
from kvferry.operator.validation import InvalidSpec, parse_spec


def spec(**overrides: Any) -> dict[str, Any]:
    return {"model": {"source": "/models/tiny", "servedName": "tiny"}, **overrides}


def test_minimal_spec_gets_defaults() -> None:
    parsed = parse_spec(spec())
    assert (parsed.prefill.replicas, parsed.decode.replicas, parsed.router.replicas) == (1, 1, 2)
    assert parsed.kv_cache.block_size == 16
    assert parsed.transfer.protocol == "ucx"
    assert parsed.redis.url is None and not parsed.redis.managed


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "spec.model: Field required"),
        (spec(prefill={"replicas": -1}), "spec.prefill.replicas: Input should be greater than or equal to 0"),
        (spec(bogus=1), "spec.bogus: Extra inputs are not permitted"),
        (spec(kvCache={"blockSize": 15}), "spec.kvCache.blockSize: Input should be 8, 16, 32, 64 or 128"),
        (spec(kvCache={"memoryFraction": 0}), "spec.kvCache.memoryFraction: Input should be greater than 0"),
        (
            spec(redis={"url": "redis://r:6379", "managed": True}),
            "spec.redis: set redis.url or redis.managed, not both",
        ),
        (
            spec(decode={"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
            "spec.decode.env: duplicate environment variable names: A",
        ),
        (spec(router={"resources": {"limits": {"cpu": "lots"}}}), "spec.router.resources.limits.cpu"),
    ],
)
def test_rejections_name_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec) as error:
        parse_spec(raw)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("models/tiny", "is a relative path"),
        ("s3://bucket/tiny", "unsupported scheme 's3'"),
        ("https://example.com/tiny", "unsupported scheme 'https'"),
        ("pvc://Not_A_Claim/x", "is not a PersistentVolumeClaim name"),
        ("hostpath://node/data", "three slashes"),
        ("hostpath:///", "root folder is refused"),
        ("/models/../etc", "escapes its root"),
    ],
)
def test_model_sources_that_cannot_work(source: str, why: str) -> None:
    with pytest.raises(InvalidSpec) as error:
        parse_spec(spec(model={"source": source, "servedName": "tiny"}))
    assert str(error.value).startswith(f"spec.model.source: {source!r}")
    assert why in str(error.value)


def test_model_sources_that_work() -> None:
    assert parse_model_source("/opt/model").path == "/opt/model"
    assert parse_model_source("/opt/model").volume is None
    pvc = parse_model_source("pvc://weights/llama/8b")
    assert pvc.path == f"{MODEL_MOUNT_PATH}/llama/8b"
    assert pvc.volume == {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
    }
    assert pvc.volume_mount() == {"name": "model", "mountPath": MODEL_MOUNT_PATH, "readOnly": True}
    assert parse_model_source("pvc://weights").path == MODEL_MOUNT_PATH
    host = parse_model_source("hostpath:///data/llama")
    assert host.path == MODEL_MOUNT_PATH
    assert host.volume == {"name": "model", "hostPath": {"path": "/data/llama", "type": "Directory"}}
