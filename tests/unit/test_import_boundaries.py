"""Which modules a light process loads: checked in a fresh interpreter, where nothing else was imported first.

The router relays HTTP and reads Redis; torch, triton and UCX would cost it seconds of start-up and hundreds
of MiB in every replica, and an import of the engine or the transfer engine is how they would come back.
The engine serves through the nodes, which bring the web framework themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Module name prefixes the router must not load.
ROUTER_MUST_NOT_LOAD = ("torch", "triton", "ucxx", "kvferry.engine", "kvferry.kernels", "kvferry.transfer")
# What of those the router may load, and why: the lazy package __init__s of the registry's and the tokenizer's
# packages; the node registry, which the router reads; the tokenizer and chat template, which the router needs
# to count a prompt's tokens and find its cached blocks (it lives in engine/ until it moves beside the block hash).
ROUTER_MAY_LOAD = {"kvferry.transfer", "kvferry.kvcache.node_registry", "kvferry.engine", "kvferry.engine.tokenizer"}
# Loaded by the CLI, for every subcommand, to register `kvferry generate` and `make-model`'s choices.
CLI_MAY_LOAD = {"kvferry.engine.commands", "kvferry.engine.model_shapes"}

WEB_FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "aiohttp")


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (which may print nothing else)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def under(modules: set[str], prefixes: tuple[str, ...]) -> set[str]:
    return {name for name in modules if any(name == p or name.startswith(p + ".") for p in prefixes)}


def test_router_app_loads_no_engine_torch_or_ucx():
    loaded = loaded_after("import kvferry.router.app")
    assert under(loaded, ROUTER_MUST_NOT_LOAD) - ROUTER_MAY_LOAD == set()
    # Nor numpy (a sixth of a second), which the block hash needed for one conversion. The CLI still loads it
    # with `kvferry loadgen`'s parser (kvferry/loadgen), for every subcommand.
    assert under(loaded, ("numpy",)) == set()


def test_router_built_by_the_cli_loads_no_engine_torch_or_ucx(tiny_models: dict[str, Path]):
    # `kvferry router` exactly as run from the shell, up to the server: uvicorn.run reports instead of serving.
    code = f"""
import json, sys, uvicorn
from kvferry.cli import main

def report(app, **options):
    print(json.dumps(sorted(sys.modules)))
    raise SystemExit(0)

uvicorn.run = report
main(["router", "--model", {str(tiny_models["llama"])!r}, "--redis-url", "redis://127.0.0.1:1/0",
      "--discovery", "registry"])
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert "kvferry.router.app" in loaded
    assert under(loaded, ROUTER_MUST_NOT_LOAD) - ROUTER_MAY_LOAD - CLI_MAY_LOAD == set()


def test_engine_loads_no_web_framework():
    assert under(loaded_after("import kvferry.engine.llm_engine"), WEB_FRAMEWORKS) == set()


def test_kvcache_loads_nothing_of_transfer():
    code = "import pkgutil, kvferry.kvcache as k\nfor m in pkgutil.iter_modules(k.__path__): __import__(f'kvferry.kvcache.{m.name}')"
    loaded = loaded_after(code)
    assert "kvferry.kvcache.prefix_index" in loaded
    assert under(loaded, ("kvferry.transfer",)) == set()


@pytest.mark.parametrize("package", ["kvferry.kvcache", "kvferry.transfer"])
def test_lazy_packages_give_every_name_they_list(package: str):
    code = f"import {package} as p\nassert all(getattr(p, name) is not None for name in p.__all__)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
