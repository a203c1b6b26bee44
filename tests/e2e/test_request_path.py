"""How far one request travels: the project files whose code runs for it, in the router and both nodes.

Each process runs under tests/support/traced_kvferry.py, which records the project files whose functions
are handed the request (its prompt, or the ids it is given on the way) between two signals. One greedy
request through P -> D, after a warm-up request (first calls import and compile), is what is counted.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster

TRACER = Path(__file__).resolve().parents[1] / "support" / "traced_kvferry.py"
PROCESSES = ("router", "prefill-0", "decode-0")
# From the router to the decode node; the prefill node's side trip is reported beside it. 16 since the body is
# read in a stage of its own (router/api/request_body.py: the model and unsupported-field check, the sampling
# fields and a structured output's grammar as the nodes' SamplingSpec); it was 15, with the translation in
# service.py and no check.
MAX_FILES = 16


def _complete(cluster: DisaggregatedCluster, prompt: list[int]) -> None:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{cluster.router}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text


def test_a_request_from_router_to_decode_crosses_at_most_16_project_files(tiny_models, tmp_path, monkeypatch):
    followed = list(range(200, 250))
    monkeypatch.setenv("KVFERRY_TRACE_OUT", str(tmp_path))
    monkeypatch.setenv("KVFERRY_TRACE_PROMPT", json.dumps(followed))
    traced = {name: [str(TRACER)] for name in PROCESSES}
    cluster = DisaggregatedCluster(tiny_models["llama"], launchers=traced)
    try:
        _complete(cluster, list(range(100, 150)))
        for name in PROCESSES:
            cluster.send_signal(name, signal.SIGUSR1)
        _complete(cluster, followed)
        for name in PROCESSES:
            cluster.send_signal(name, signal.SIGUSR2)
        traces = {name: tmp_path / f"{name}.json" for name in PROCESSES}
        cluster.wait_until(lambda: all(path.exists() for path in traces.values()), 10, "the traces written")
        files = {name: json.loads(path.read_text()) for name, path in traces.items()}
    finally:
        cluster.stop()
    to_decode = sorted(set(files["router"]) | set(files["decode-0"]))
    everywhere = sorted(set().union(*files.values()))
    print(f"router -> decode: {len(to_decode)} files; with the prefill node: {len(everywhere)}")
    print(json.dumps(files, indent=1))
    assert len(to_decode) <= MAX_FILES, f"{len(to_decode)} files: {to_decode}"
    # Each process's share is its own layer: the router's stages, and each node's server, connector and engine.
    assert {path.split("/")[0] for path in files["router"]} <= {"router", "kvcache"}
    assert {"prefill_node/connector.py", "transfer/kv_connector.py"} <= set(files["prefill-0"])
    assert {"decode_node/connector.py", "transfer/kv_connector.py"} <= set(files["decode-0"])
