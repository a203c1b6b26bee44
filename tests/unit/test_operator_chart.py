"""Static checks of the Helm chart that need no helm binary (helm lint and installs are e2e tests)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kvferry import __version__
from kvferry.operator.crd import CHART_CRD_PATH
from kvferry.operator.validation import parse_spec

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kvferry"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w.-]*):(?P<rest>.*)$")


def undocumented_values(text: str) -> list[str]:
    """Leaf keys of values.yaml with no comment right above them or above one of their parents."""
    missing: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented)
    previous = ""
    for line in text.splitlines():
        match = KEY.match(line)
        if match:
            indent = len(match["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            documented = previous.lstrip().startswith("#") or any(doc for _, _, doc in stack)
            is_leaf = match["rest"].strip() != ""
            if is_leaf and not documented:
                missing.append(".".join([key for _, key, _ in stack] + [match["key"]]))
            stack.append((indent, match["key"], documented))
        if line.strip():
            previous = line
    return missing


def test_every_value_has_a_comment() -> None:
    assert undocumented_values((CHART / "values.yaml").read_text()) == []


def test_the_check_finds_an_undocumented_value() -> None:
    assert undocumented_values("a:\n  # doc\n  b: 1\n  c: 2\n# doc\nd:\n  e: 3\n") == ["a.c"]


def test_chart_version_follows_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__


def test_crd_lives_in_crds_folder() -> None:
    assert (REPO / CHART_CRD_PATH).parent == CHART / "crds"


def test_example_is_a_valid_spec() -> None:
    example = yaml.safe_load((REPO / "examples" / "inferencecluster.yaml").read_text())
    assert example["kind"] == "InferenceCluster"
    parse_spec(example["spec"])
