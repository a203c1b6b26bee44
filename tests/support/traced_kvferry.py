"""`python traced_kvferry.py ARGS...` runs `kvferry ARGS...` and records the project files a request crosses,
for tests/e2e/test_request_path.py.

A file is crossed when one of its functions is handed the request: its prompt (the token list, or an object
or body holding it as `prompt`, `prompt_ids` or `prompt_token_ids`), or an id the request was given along
the way (a `request_id` passed beside the prompt, and every later call handed that id). Helpers that only
see pieces of it (a metric, a block, a byte count) are not counted: they are what the request's path uses,
not where it goes. The prompt to follow is `$KVFERRY_TRACE_PROMPT` (JSON).

SIGUSR1 starts a fresh record; SIGUSR2 writes it, as a JSON list of paths relative to the checkout, to
`$KVFERRY_TRACE_OUT/<name>.json` (`<name>` the process's `--name`, else its subcommand).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

CHECKOUT = Path(__file__).resolve().parents[2]
PROJECT_ROOT = f"{CHECKOUT}/"
NOT_PROJECT = tuple(f"{CHECKOUT}/{folder}/" for folder in (".venv", "tests", "build"))
PROMPT_FIELDS = ("prompt", "prompt_ids", "prompt_token_ids")
crossed: set[str] = set()
request_ids: set[str] = set()
recording = False
prompt: list[int] = json.loads(os.environ.get("KVFERRY_TRACE_PROMPT", "[]"))


def _holds_prompt(value: object) -> bool:
    if isinstance(value, list):
        return value == prompt
    if isinstance(value, dict):
        return any(value.get(field) == prompt for field in PROMPT_FIELDS)
    return any(getattr(value, field, None) == prompt for field in PROMPT_FIELDS)


def _handed_the_request(frame: FrameType) -> bool:
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    values = [frame.f_locals.get(name) for name in names]
    if any(isinstance(value, str) and value in request_ids for value in values):
        return True
    if not any(_holds_prompt(value) for value in values if value is not None):
        return False
    request_id = frame.f_locals.get("request_id")
    if isinstance(request_id, str):
        request_ids.add(request_id)
    return True


def _profile(frame: FrameType, event: str, _arg: object) -> None:
    if recording and event == "call":
        path = frame.f_code.co_filename
        if path.startswith(PROJECT_ROOT) and not path.startswith(NOT_PROJECT) and path not in crossed:
            with _lock:
                if _handed_the_request(frame):
                    crossed.add(path)


def _start(*_: object) -> None:
    global recording
    crossed.clear()
    request_ids.clear()
    recording = True


def _write(*_: object) -> None:
    global recording
    recording = False
    argv = sys.argv[1:]
    name = argv[argv.index("--name") + 1] if "--name" in argv else argv[0]
    out = Path(os.environ["KVFERRY_TRACE_OUT"]) / f"{name}.json"
    out.write_text(json.dumps(sorted(str(Path(path).relative_to(CHECKOUT)) for path in crossed)))


_lock = threading.Lock()

if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _write)
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    from kvferry.cli import main

    sys.exit(main(sys.argv[1:]))
