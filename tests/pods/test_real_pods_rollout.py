"""Changes to a serving cluster on real pods, under load (issue 23): the planner scaling decode for a load
step and back, a rollout that cannot finish stopping with the old pods serving, and a model change in which
every answer comes from one model, old or new, never from a pair of both.

Runs after test_real_pods_faults.py (one pod per role) and leaves one pod per role, serving the new model,
for test_real_pods_teardown.py.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

from cluster.waiting import wait_until
from pods.model_variant import greedy_texts, noisy_copy
from pods.served_cluster import CLUSTER, SERVED_NAME, WORKERS, ServedCluster
from pods.serving_loop import MAX_TOKENS, PROMPTS, ServingLoop, undisturbed_texts
from support.real_model import RealModel

SCALE_DOWN_WINDOW_S = 30
# An inter-token latency no CPU pod reaches: any streaming load reads as overload, so the step is certain and
# the count is bounded by maxReplicas, not by how fast this machine happens to be (tests/unit tests the
# planner's arithmetic on simulated roles).
DECODE_AUTOSCALING = {"minReplicas": 1, "maxReplicas": 2, "itlP90Seconds": 0.001,
                      "scaleDownWindowSeconds": SCALE_DOWN_WINDOW_S}
# A few intervals to decide, then a pod's start on a 2-core machine that runs the tests too.
SCALE_UP_BOUND_S = 300
DEADLINE_S = 30  # the smallest rolloutDeadlineSeconds


def _autoscaled(served: ServedCluster, role: str) -> list[str]:
    """The actions of the operator's Autoscaled events for the role, oldest first ("scale up 1 -> 2")."""
    events = sorted((e for e in served.items("events") if e.get("reason") == "Autoscaled"),
                    key=lambda e: (e.get("lastTimestamp") or "", e["metadata"]["creationTimestamp"]))
    return [e["message"].split(": ")[1] for e in events if e["message"].startswith(f"{role}: ")]


def _decode_decisions(served: ServedCluster) -> list[tuple[float, int, str]]:
    """The planner's decode decisions from the operator pods' logs: (seconds, the count that interval alone
    recommended, the decision), oldest first. The seconds are the container runtime's timestamps of the lines,
    so they are comparable with each other, not with this process's clock."""
    logs = served.kubectl("logs", "--selector=app.kubernetes.io/component=operator", "--timestamps",
                          "--tail=-1").stdout
    line = re.compile(rf"^(\S+) .*autoscaling {served.namespace}/{CLUSTER} decode: (\d+) recommended; (.*)$")
    decisions = [(_seconds(m[1]), int(m[2]), m[3]) for m in map(line.match, logs.splitlines()) if m]
    return sorted(decisions)


def _seconds(stamp: str) -> float:
    """An RFC 3339 timestamp with up to nanoseconds, as kubectl --timestamps prints it, in seconds."""
    whole, _, fraction = stamp.removesuffix("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + float(f"0.{fraction or 0}")


def test_a_load_step_makes_the_planner_add_a_decode_pod_and_its_end_takes_it_back(served: ServedCluster) -> None:
    expected = undisturbed_texts(served.router, SERVED_NAME)
    served.patch_spec(CLUSTER, {"decode": {"autoscaling": DECODE_AUTOSCALING}})
    with ServingLoop(served.router, SERVED_NAME, expected, workers=WORKERS, max_requests=2000, max_seconds=900) as loop:
        stepped = time.monotonic()
        served.wait_scaled("decode", 2)
        scaled_up_s = time.monotonic() - stepped
        # The load goes on for several of the planner's intervals: the count holds.
        answered = loop.snapshot().answered
        wait_until("24 answers at two decode pods", lambda: loop.snapshot().answered >= answered + 24, 300)
        assert len(served.ready_pods("decode")) == 2
    outcomes = loop.stop()
    ended = time.monotonic()
    served.wait_scaled("decode", 1)
    scaled_down_s = time.monotonic() - ended
    served.patch_spec(CLUSTER, {"decode": {"autoscaling": None}})
    print(f"load step: {outcomes}; 2 decode pods ready {scaled_up_s:.0f} s after the step, "
          f"1 left {scaled_down_s:.0f} s after the load ended")
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)
    assert scaled_up_s < SCALE_UP_BOUND_S
    assert _autoscaled(served, "decode") == ["scale up 1 -> 2", "scale down 2 -> 1"]  # and nothing between
    # The window: the count came down a full window after the last interval that asked for two. (Not timed
    # from the load's end: decode's load is the requests running at an interval's end, and with a few short
    # streams an interval can end between them, so the last interval asking for two may precede the end.)
    decisions = _decode_decisions(served)
    [down_s] = [at_s for at_s, _, decision in decisions if decision.startswith("scale down 2 -> 1")]
    last_two_s = max(at_s for at_s, recommended, _ in decisions if at_s < down_s and recommended >= 2)
    # A line is written a few milliseconds after its interval's clock reading: a second of slack.
    assert down_s - last_two_s >= SCALE_DOWN_WINDOW_S - 1, decisions


def test_a_rollout_whose_pods_cannot_start_stops_with_the_old_pods_serving(served: ServedCluster) -> None:
    expected = undisturbed_texts(served.router, SERVED_NAME)
    image = (served.get("inferencecluster", CLUSTER) or {})["spec"]["image"]

    def stopped() -> dict[str, Any]:
        def degraded() -> dict[str, Any] | None:
            status = served.status(CLUSTER)
            return status if status.get("phase") == "Degraded" else None

        return wait_until(lambda: f"{CLUSTER} Degraded; status {served.status(CLUSTER)}", degraded, DEADLINE_S + 120)

    outcomes = served.under_load(
        expected, "a rollout to an image that does not exist",
        lambda: served.patch_spec(CLUSTER, {"image": "localhost/kvferry:missing", "rolloutDeadlineSeconds": DEADLINE_S}),
        stopped)
    status = served.status(CLUSTER)
    served.patch_spec(CLUSTER, {"image": image, "rolloutDeadlineSeconds": None})
    served.wait_rolled()
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ProgressDeadlineExceeded", status


def test_a_model_change_under_load_answers_each_request_from_one_model(
    served: ServedCluster, smollm2: RealModel
) -> None:
    """The new model is the default one with other weights (model_variant.py): same architecture, tokenizer
    and KV layout, so only the weights' fingerprint keeps a prefill pod of one from handing KV to a decode
    pod of the other. Every answer is one model's greedy text; a mixed pair's text would be neither."""
    variant = noisy_copy(smollm2.folder, served.kube.workdir / "models" / "smollm2-noisy")
    old = undisturbed_texts(served.router, SERVED_NAME)
    new = greedy_texts(variant, PROMPTS, MAX_TOKENS)
    assert all(old[prompt] != new[prompt] for prompt in PROMPTS)  # else a mix could pass for one model
    outcomes = served.under_load(
        {prompt: (old[prompt], new[prompt]) for prompt in PROMPTS}, "the model changed",
        lambda: served.patch_spec(CLUSTER, {"model": {"source": f"hostpath://{variant}"}}), served.wait_rolled)
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)
    assert outcomes.answers.get("text 1", 0) >= 8, outcomes.answers  # the new model served once rolled out
    assert undisturbed_texts(served.router, SERVED_NAME) == new
