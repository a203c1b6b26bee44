"""The packaging recipe of DESIGN.md §1: the checkout runs from its root, and a wheel stands alone."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SUBCOMMANDS = ("make-model", "generate", "operator", "prefill", "decode", "router", "up", "loadgen", "bench")


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_operator_folder_has_no_init_and_stdlib_operator_still_wins():
    assert not (REPO / "operator" / "__init__.py").exists()
    out = _run([sys.executable, "-c", "import operator, kvferry.operator; print(operator.add(2, 3))"], REPO)
    assert out.stdout.strip() == "5"


def test_cli_help_from_the_repo_root():
    out = _run([sys.executable, "-m", "kvferry", "--help"], REPO)
    for command in SUBCOMMANDS:
        assert command in out.stdout
    assert "make-model" in _run([str(VENV_BIN / "kvferry"), "--help"], REPO).stdout


@pytest.mark.parametrize("runner", [["pytest"], ["python", "-m", "pytest"]])
def test_pytest_collects_from_the_root(runner):
    command = [str(VENV_BIN / runner[0]), *runner[1:], "--collect-only", "-q", "tests/unit/test_block_hash.py"]
    out = _run(command, REPO)
    ids = [line for line in out.stdout.splitlines() if line.startswith("tests/unit/test_block_hash.py::")]
    assert ids and f"{len(ids)} tests collected" in out.stdout, out.stdout


def _wheel_modules(names: list[str]) -> list[str]:
    """Every module the wheel holds, as import names; `__main__` runs the CLI when imported."""
    modules = []
    for name in names:
        if name.endswith(".py") and not name.endswith("/__main__.py"):
            module = name.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
            modules.append(module)
    return sorted(modules)


def test_wheel_installs_into_a_fresh_venv_imports_every_module_and_answers_help(tmp_path):
    _run([str(VENV_BIN / "uv"), "build", "--wheel", "--out-dir", str(tmp_path), str(REPO)], tmp_path)
    wheel = next(tmp_path.glob("kvferry-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvferry/operator/command.py" in names and "kvferry/engine/llm.py" in names
    assert "kvferry/router/scheduling/scheduler.py" in names  # a subpackage, found without being listed
    assert "kvferry/data/corpus.txt" in names
    assert not any(name.startswith(("operator/", "kernels/", "tests/", "benchmarks/")) for name in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    _run([str(VENV_BIN / "uv"), "pip", "install", "--python", str(venv / "bin" / "python"), "--no-deps", str(wheel)], tmp_path)
    # Dependencies come from the project's venv through PYTHONPATH; its editable-install hook is a .pth
    # file, which PYTHONPATH does not run, so only the wheel can provide kvferry here.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    modules = _wheel_modules(names)
    assert len(modules) > 100
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    print(importlib.import_module(name).__file__)"
    out = _run([str(venv / "bin" / "python"), "-c", code, *modules], tmp_path, env)
    files = out.stdout.split()
    assert len(files) == len(modules)
    for line in files:
        assert line.startswith(str(venv)), f"imported from outside the fresh venv: {line}"

    kvferry = str(venv / "bin" / "kvferry")
    assert "make-model" in _run([kvferry, "--help"], tmp_path, env).stdout
    for command in SUBCOMMANDS:
        assert "usage: kvferry " + command in _run([kvferry, command, "--help"], tmp_path, env).stdout
