"""The router over HTTPS (`--tls-cert-file`, `--tls-key-file`): the official openai client given the CA
bundle gets its answers; plain HTTP on the same port, and a client that does not trust the CA, get none.
Random tiny weights: this is about the channel, not the text."""

from __future__ import annotations

import ssl

import httpx
import openai
import pytest
from cluster.pki import Pki
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster

MAX_TOKENS = 4


def test_the_openai_client_with_the_ca_bundle_talks_https_and_plain_http_gets_nothing(tiny_models, tmp_path,
                                                                                       monkeypatch) -> None:
    pki = Pki(tmp_path / "pki")
    cert, key = pki.serving("router")
    cluster = DisaggregatedCluster(tiny_models["llama"])
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_cert))  # how this process sees the router ready
        url = cluster.add_router("tls-router", ["prefill-0", "decode-0"],
                                 ["--tls-cert-file", str(cert), "--tls-key-file", str(key)], scheme="https")
        with httpx.Client(verify=ssl.create_default_context(cafile=pki.ca_cert)) as trusting:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", http_client=trusting, max_retries=0)
            answer = client.completions.create(model=MODEL_NAME, prompt="The capital of France is",
                                               max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
            assert answer.usage.completion_tokens == MAX_TOKENS
            chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                                  max_tokens=MAX_TOKENS, stream=True)
            assert sum(1 for chunk in chat if chunk.choices and chunk.choices[0].delta.content is not None) >= 1

        plain = url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):  # a TLS port answers no plain request
            httpx.get(f"{plain}/health", timeout=10)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # nor a client without the CA
            httpx.get(f"{url}/health", timeout=10, verify=True, trust_env=False)
    finally:
        cluster.stop()


def test_a_certificate_without_its_key_is_a_clear_error(tmp_path) -> None:
    from kvferry.cli import main

    with pytest.raises(SystemExit, match="--tls-cert-file and --tls-key-file go together"):
        main(["router", "--model", str(tmp_path), "--decode", "http://127.0.0.1:1", "--tls-cert-file", "x.pem"])
