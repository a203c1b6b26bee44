"""kvferry/tls: the certificate flags, a rotated file noticed by its content, a CA bundle that grows when its
file changes; and the router's refusal of plain-HTTP nodes once it speaks TLS to them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cluster.pki import Pki
from pydantic import ValidationError

from kvferry.kvcache.node_registry import InMemoryRegistry
from kvferry.node.config import NodeConfig
from kvferry.router.config import RouterConfig
from kvferry.router.discovery.nodes import Endpoint
from kvferry.router.discovery.registry_view import RegistryView
from kvferry.router.discovery.sources import RegistryDiscovery
from kvferry.tls.client import NodeTrust
from kvferry.tls.files import ServingFiles
from kvferry.tls.watch import FileWatch


def test_a_certificate_needs_its_key_and_both_must_be_readable(tmp_path: Path) -> None:
    assert ServingFiles.from_flags(None, None) is None
    with pytest.raises(ValueError, match="go together"):
        ServingFiles.from_flags("tls.crt", None)
    with pytest.raises(FileNotFoundError, match="missing.key"):
        ServingFiles.from_flags(__file__, str(tmp_path / "missing.key"))
    with pytest.raises(ValueError, match="go together"):  # a node's config says so before it loads its model
        NodeConfig(role="decode", name="d", model="m", tls_key_file=__file__)


def test_a_node_with_a_certificate_publishes_an_https_url() -> None:
    assert NodeConfig(role="decode", name="d", model="m", port=8100).url == "http://127.0.0.1:8100"
    served = NodeConfig(
        role="decode", name="d", model="m", port=8100, tls_cert_file=__file__, tls_key_file=__file__
    )
    assert served.url == "https://127.0.0.1:8100"


def test_a_watch_reloads_when_the_content_changes_and_retries_a_failed_reload(tmp_path: Path) -> None:
    path = tmp_path / "tls.crt"
    path.write_text("one")
    loads: list[str] = []
    failing = False

    def reload() -> None:
        if failing:
            raise OSError("key values mismatch")
        loads.append(path.read_text())

    watch = FileWatch([str(path)], reload)
    assert not watch.check() and loads == []  # what it started with is loaded already
    path.write_text("one")  # rewritten, the same content: nothing to do
    assert not watch.check()
    path.write_text("two")
    failing = True
    assert not watch.check() and loads == []  # the old files stay in use...
    failing = False
    assert watch.check() and loads == ["two"]  # ...and the next check tries again
    path.unlink()  # mid-swap: nothing to load
    assert not watch.check()


def test_the_router_trusts_only_its_ca_and_adds_a_rotated_one(tmp_path: Path) -> None:
    first, second = Pki(tmp_path / "first"), Pki(tmp_path / "second")
    bundle = tmp_path / "ca.crt"
    shutil.copy(first.ca_cert, bundle)
    trust = NodeTrust(str(bundle))
    context = trust.context()
    assert [ca["subject"] for ca in context.get_ca_certs()] == [
        ((("commonName", "kvferry-test-ca"),),)
    ]  # no system CA
    watch = trust.watch(context)
    shutil.copy(second.ca_cert, bundle)
    assert watch.check()
    assert len(context.get_ca_certs()) == 2  # the old CA's nodes stay trusted while the new one rolls out


def test_with_internal_tls_plain_http_nodes_are_refused_or_ignored(tmp_path: Path) -> None:
    def config(ca_file: Path, decode: str) -> RouterConfig:
        tls = {"ca_file": str(ca_file)}
        return RouterConfig.model_validate(
            {"model": {"path": "m"}, "internal_tls": tls, "discovery": {"decode": [decode]}}
        )

    ca = Pki(tmp_path / "pki").ca_cert
    assert config(ca, "https://10.0.0.2:8100").node_scheme == "https"
    with pytest.raises(ValidationError, match="are not https://"):
        config(ca, "http://10.0.0.2:8100")
    with pytest.raises(ValidationError, match="cannot load the CA bundle"):  # said at start, naming the file
        config(tmp_path / "missing.crt", "https://10.0.0.2:8100")
    registry = InMemoryRegistry()
    registry.publish("plain", {"role": "decode", "url": "http://10.0.0.1:8100"})
    registry.publish("tls", {"role": "decode", "url": "https://10.0.0.2:8100"})
    view = RegistryView(registry, stale_after_seconds=15)
    view.refresh()
    assert RegistryDiscovery(view, "https").endpoints() == [Endpoint("https://10.0.0.2:8100", "decode")]
    assert RegistryDiscovery(view).endpoints() == [Endpoint("http://10.0.0.1:8100", "decode")]
