"""kvferry's benchmarks, each run from the checkout root as `python -m benchmarks.<name>` (docs/benchmarks.md)."""
