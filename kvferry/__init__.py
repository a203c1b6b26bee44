"""kvferry: disaggregated prefill/decode LLM serving on Kubernetes."""

from pathlib import Path

__version__ = "0.1.0"

# In a source checkout the component folders (engine/, router/, operator/, ...) sit beside this package
# rather than inside it. Appending the repo root to __path__ makes `kvferry.operator` resolve to
# ./operator as a namespace portion, without an operator/__init__.py that would shadow the standard
# library (DESIGN.md §1). An installed wheel has them inside the package and skips this.
_repo_root = Path(__file__).resolve().parent.parent
if (_repo_root / "pyproject.toml").is_file() and (_repo_root / "engine").is_dir():
    __path__.append(str(_repo_root))  # type: ignore[name-defined]
