"""Fixtures shared by all test folders; plugins keep each fixture next to what it sets up.

The checkout root stays off sys.path, here and in every Python process the tests start: its folders
(kernels/, operator/, router/, engine/...) would stand in for installed packages of the same name, as
kernels/ once did for Hugging Face's `kernels` inside transformers. pytest puts tests/ on sys.path
instead (pyproject.toml: pythonpath, importlib import mode), so helpers import as `support.*`, and the
environment below gives child processes the same view: PYTHONSAFEPATH keeps `python -m` from adding
their working directory, PYTHONPATH gives them tests/.
"""

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent

os.environ["PYTHONSAFEPATH"] = "1"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))

pytest_plugins = [
    "cluster.fixtures",
    "support.redis_server",
    "support.models",
    "support.real_model",
    "support.serving_fixtures",
]
