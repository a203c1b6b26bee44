"""Plot benchmarks/results/gpu_serving.json: output tokens/s against concurrency for kvferry, its roofline
and transformers, one panel per case.

    python -m benchmarks.gpu_plot   # writes benchmarks/results/gpu_serving.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()  # no options: --help
    data = json.loads((RESULTS / "gpu_serving.json").read_text())
    rows = data["rows"]
    cases = list(dict.fromkeys(row["case"] for row in rows))
    figure, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4), sharey=True)
    series = (("roofline_tok_s", "roofline", "k--"), ("kvferry_tok_s", "kvferry", "o-"), ("hf_tok_s", "transformers", "s-"))
    for axis, case in zip(axes, cases, strict=True):
        picked = [row for row in rows if row["case"] == case]
        for key, label, style in series:
            points = [(row["concurrency"], row[key]) for row in picked if row.get(key)]
            axis.plot(*zip(*points, strict=True), style, label=label)
        axis.set(title=case, xscale="log", yscale="log", xlabel="concurrency")
        axis.set_xticks([row["concurrency"] for row in picked], [str(row["concurrency"]) for row in picked])
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("output tokens/s")
    axes[0].legend()
    gpu = data["environment"]["cuda"]
    figure.suptitle(f"Llama-3.1-8B-shaped bf16 model on one {gpu}")
    figure.tight_layout()
    figure.savefig(RESULTS / "gpu_serving.png", dpi=110)


if __name__ == "__main__":
    main()
