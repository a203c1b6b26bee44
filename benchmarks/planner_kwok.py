"""The operator's Autoscaler over a simulated day of Mooncake's trace, on a control plane with 100 kwok nodes.

The control plane is the tests' (tests/cluster/control_plane.py: etcd, kube-apiserver, controller-manager,
scheduler, and kwok playing kubelet for `--nodes` fake Nodes, so Deployments' pods are scheduled and turn
Ready but run nothing). The CRD and the operator (`python -m kvferry operator`, its own autoscaler quiet)
start as tests/e2e/test_kubernetes_autoscaling.py starts them; an InferenceCluster with autoscaling on prefill
and decode is applied. This process then drives an Autoscaler (operator/autoscaler.py) of its own, once an
interval of simulated time, with a fake clock and a `fetch` that answers each pod's /metrics URL with
Prometheus text made from the simulated cluster (planner_cluster_sim.py): the router's histograms and
counters, each node pod's gauges, and each prefill pod's TTFT phase histograms (queue, prefill) and busy
seconds. The simulated cluster has one replica per pod the API shows: a pod that
appears starts serving `--startup-s` later (until then its /metrics does not answer), a pod deleted drains.
The workload, the costs (the service times planner_trace measured, read from its result) and the targets are
planner_trace's. Recorded per interval: the planner's decision (status.autoscaling), the pods of each role
the API shows, the replicas serving in the simulation, the SLO attainment of the interval's arrivals.

    make cluster-binaries
    .venv/bin/python -m benchmarks.planner_kwok            # -> benchmarks/results/planner_kwok.json, .png
    .venv/bin/python -m benchmarks.planner_kwok --quick    # 10 nodes, a one-hour day at 2 req/s
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.plot import save_plot
from benchmarks.harness.processes import wait_until
from benchmarks.harness.results import RESULTS, new_result, params_of, write_result
from benchmarks.planner_cluster_sim import (
    ROLES,
    ClusterSim,
    DecodeReplica,
    PrefillReplica,
    Slo,
    attainment_by_interval,
)
from benchmarks.planner_service_times import ServiceTimes
from benchmarks.planner_trace import add_cluster_arguments, outcome
from benchmarks.planner_workload import diurnal_requests
from kvferry.operator.autoscaler import Autoscaler
from kvferry.operator.connection import load_configuration
from kvferry.operator.kube import Kube
from kvferry.operator.naming import API_VERSION, CLUSTER_LABEL, KIND, ROLE_LABEL
from kvferry.operator.planner.readings import (
    BUSY,
    KV_USAGE,
    PROMPT_TOKENS,
    RUNNING,
    TOKEN_GAP,
    TTFT,
    TTFT_PHASE,
    Buckets,
    RouterTotals,
)
from kvferry.operator.reconcile import ReconcileSettings

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "planner"
# The operator process runs for its reconciles and status; its own autoscaler would scrape kwok's pods, which
# serve nothing, so it waits an hour: this process drives an Autoscaler of its own.
QUIET_AUTOSCALER = "--autoscale-seconds=3600"
PODS_FOLLOW_S = 120.0  # for a decision's pods to exist (or be gone) in the API


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "planner_kwok")
    parser.add_argument("--quick", action="store_true", help="10 nodes, a one-hour day at 2 req/s")
    parser.add_argument("--service-times", type=Path, default=RESULTS / "planner_trace.json",
                        help="the planner_trace result whose measured service times to use")
    parser.add_argument("--nodes", type=int, default=100, help="kwok's fake Nodes")
    add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.peak_rps, args.day_hours = 10, 2.0, 1.0
    return args


def router_text(totals: RouterTotals, share: float) -> str:
    """One router's /metrics as the planner reads it (the TTFT and token-gap histograms, prompt tokens): its
    `share` of the cluster's, so that the routers' texts add up to the cluster's as the operator adds them."""
    registry = CollectorRegistry()
    families = [_histogram(TTFT, totals.ttft, share), _histogram(TOKEN_GAP, totals.token_gap, share),
                CounterMetricFamily(PROMPT_TOKENS, "Prompt tokens routed", value=totals.prompt_tokens * share)]
    registry.register(_Fixed(families))
    return generate_latest(registry).decode()


def node_text(role: str, name: str, running: float, kv_usage: float | None,
              phases: dict[str, Buckets] | None = None, busy_s: float | None = None) -> str:
    """One node's /metrics as the planner reads it: its gauges, and a prefill node's TTFT phases (`queue`,
    `prefill`) and busy seconds, labelled with the node's role and name as NodeMetrics labels them."""
    registry = CollectorRegistry()
    families = [GaugeMetricFamily(RUNNING, "Requests running", value=running)]
    if kv_usage is not None:
        families.append(GaugeMetricFamily(KV_USAGE, "KV blocks in use", value=kv_usage))
    if phases:
        family = HistogramMetricFamily(TTFT_PHASE, "Time to first token, by phase", labels=["role", "node", "phase"])
        for phase, buckets in phases.items():
            family.add_metric([role, name, phase], _bucket_samples(buckets, 1.0), None)
        families.append(family)
    if busy_s is not None:
        busy = CounterMetricFamily(BUSY, "Seconds the engine spent in steps", labels=["role", "node"])
        busy.add_metric([role, name], busy_s)
        families.append(busy)
    registry.register(_Fixed(families))
    return generate_latest(registry).decode()


def _histogram(name: str, buckets: dict[float, float], share: float) -> HistogramMetricFamily:
    # no _sum: nothing reads it, and the simulation does not keep one
    return HistogramMetricFamily(name, name, buckets=_bucket_samples(buckets, share))


def _bucket_samples(buckets: Buckets, share: float) -> list[tuple[str, float]]:
    return [(floatToGoString(bound), count * share) for bound, count in sorted(buckets.items())]


class _Fixed:
    """A collector that hands out the families it was made with."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


class SimulatedPods:
    """The simulated cluster behind the API's pods: one replica per prefill or decode pod, and every /metrics
    URL answered from it (a router pod's with the router's counters)."""

    def __init__(self, kube: Kube, cluster: str, sim: ClusterSim) -> None:
        self.kube, self.cluster, self.sim = kube, cluster, sim
        self.pods: dict[str, tuple[str, str]] = {}  # pod IP -> (role, pod name)
        self.routers = 1  # router pods: the example runs two, each routing its share of the requests

    def role_pods(self, role: str) -> list[dict[str, Any]]:
        """The role's pods that are not being deleted."""
        pods = self.kube.list("v1", "Pod", NAMESPACE, f"{CLUSTER_LABEL}={self.cluster},{ROLE_LABEL}={role}")
        return [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]

    def sync(self, ready_now: bool = False) -> dict[str, int]:
        """Replicas added for new pods (serving after the start-up, or at once with `ready_now`) and drained
        for deleted ones; the role's pods per role."""
        counts = {}
        for role in (*ROLES, "router"):
            pods = self.role_pods(role)
            counts[role] = len(pods)
            names = {pod["metadata"]["name"] for pod in pods}
            self.pods.update({pod["status"]["podIP"]: (role, pod["metadata"]["name"])
                              for pod in pods if pod["status"].get("podIP")})
            if role == "router":
                self.routers = max(1, len(pods))
                continue
            for name in names - set(self.sim.replicas[role]):
                self.sim.add_replica(role, name, ready_s=self.sim.now_s if ready_now else None)
            for name in set(self.sim.live(role)) - names:
                self.sim.remove_replica(role, name)
        return counts

    def fetch(self, urls: list[str]) -> list[str]:
        """The texts of the pods that answer: a pod the simulation has not seen, or still starting, does not."""
        texts = []
        for url in urls:
            role, name = self.pods.get(url.split("//")[1].split(":")[0], ("", ""))
            if role == "router":
                texts.append(router_text(self.sim.router_totals(), 1 / self.routers))
            elif role in ROLES and self.sim.replicas[role][name].serving(self.sim.now_s):
                replica = self.sim.replicas[role][name]
                if isinstance(replica, DecodeReplica):
                    texts.append(node_text(role, name, len(replica.streams), self.sim.kv_usage(replica)))
                elif isinstance(replica, PrefillReplica):
                    texts.append(node_text(role, name, 0.0, None, {"queue": replica.queue.cumulative(),
                                                                   "prefill": replica.compute.cumulative()},
                                           replica.busy_s(self.sim.now_s)))
        return texts


@dataclass(frozen=True)
class Interval:
    at_s: float
    wall_s: float  # this interval's autoscaling and the pods following it
    decided: dict[str, int]  # status.autoscaling
    pods: dict[str, int]  # in the API after the decision
    serving: dict[str, int]  # in the simulation, at the interval's end
    reasons: dict[str, str]
    attainment: float | None = None


def start_operator(kubeconfig: str, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "kvferry", "operator", f"--kubeconfig={kubeconfig}", f"--namespace={NAMESPACE}",
            "--identity=planner-kwok", QUIET_AUTOSCALER]
    env = {key: value for key, value in os.environ.items() if key not in ("POD_NAME", "POD_NAMESPACE")}
    with log.open("wb") as sink:
        return subprocess.Popen(argv, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, env=env)


def autoscaled_cluster(example: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The example InferenceCluster with planner_trace's targets on both roles."""
    spec = example["spec"]
    spec["prefill"].update(replicas=args.start_prefill, autoscaling={
        "minReplicas": 1, "maxReplicas": args.max_replicas, "ttftP90Seconds": args.ttft_target_s})
    spec["decode"].update(replicas=args.start_decode, autoscaling={
        "minReplicas": 1, "maxReplicas": args.max_replicas, "itlP90Seconds": args.itl_target_s})
    return example


def run_day(kube: Kube, name: str, sim: ClusterSim, args: argparse.Namespace) -> list[Interval]:
    pods = SimulatedPods(kube, name, sim)
    pods.sync(ready_now=True)  # the cluster's first pods have been serving for a while
    now = [0.0]
    autoscaler = Autoscaler(kube, (NAMESPACE,), ReconcileSettings(), fetch=pods.fetch, clock=lambda: now[0])
    autoscaler.run_once()  # the first scrape bounds no interval
    timeline = []
    for number in range(1, int(args.day_hours * 3600 / args.interval_s) + 1):
        started = time.perf_counter()
        now[0] = number * args.interval_s
        sim.run_until(now[0])
        serving = {role: len(sim.serving(role)) for role in ROLES}
        autoscaler.run_once()
        decided = ((kube.get(API_VERSION, KIND, NAMESPACE, name) or {})
                   .get("status", {}).get("autoscaling", {}))
        for role in ROLES:
            wanted = decided[role]["replicas"]
            if not wait_until(lambda role=role, wanted=wanted: len(pods.role_pods(role)) == wanted, PODS_FOLLOW_S,
                              0.1):
                raise RuntimeError(f"{role}: {len(pods.role_pods(role))} pods, {wanted} decided")
        counts = pods.sync()
        timeline.append(Interval(now[0], round(time.perf_counter() - started, 3),
                                 {role: decided[role]["replicas"] for role in ROLES},
                                 {role: counts[role] for role in ROLES}, serving,
                                 {role: decided[role]["reason"] for role in ROLES}))
        if number % 20 == 0:
            print(f"{now[0] / 3600:.2f} h: decided {timeline[-1].decided}, serving {serving}, "
                  f"{timeline[-1].wall_s:.2f} s", flush=True)
    return timeline


def plot(timeline: list[Interval], path: Path) -> Path | None:
    def draw(pyplot: Any) -> Any:
        figure, (replicas, attained) = pyplot.subplots(2, 1, figsize=(10, 7), sharex=True)
        hours = [interval.at_s / 3600 for interval in timeline]
        for role, color in (("prefill", "tab:blue"), ("decode", "tab:orange")):
            replicas.plot(hours, [i.decided[role] for i in timeline], color=color, label=f"{role} decided")
            replicas.plot(hours, [i.serving[role] for i in timeline], color=color, linestyle=":",
                          label=f"{role} serving")
        replicas.plot(hours, [sum(i.pods.values()) for i in timeline], color="gray", linewidth=0.8,
                      label="prefill + decode pods (API)")
        replicas.set(title="The operator's Autoscaler on kwok: replicas", ylabel="replicas")
        replicas.legend(fontsize=8)
        attained.plot(hours, [i.attainment for i in timeline], linewidth=0.8)
        attained.set(title="SLO attainment of each interval's arrivals", xlabel="simulated hours",
                     ylabel="attainment", ylim=(0, 1.02))
        figure.tight_layout()
        return figure

    return save_plot(path, draw)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The control plane and the e2e helpers are the tests', used as they are: they import each other as
    # top-level packages, so tests/ must be on the path as pytest puts it (pyproject.toml's `pythonpath`).
    # The command says so (PYTHONPATH=tests) rather than this module editing sys.path behind the caller.
    try:
        from cluster.control_plane import ControlPlane
        from e2e.example_cluster import NAME, example
        from e2e.kube_cluster import CRD_FILE, OPERATOR_START_S, Cluster
    except ImportError as exc:
        raise SystemExit(f"planner_kwok needs the tests' control plane: run it as "
                         f"PYTHONPATH=tests .venv/bin/python -m benchmarks.planner_kwok ({exc})") from None

    started = time.perf_counter()
    times = ServiceTimes.from_result(args.service_times)
    day_s = args.day_hours * 3600
    sim = ClusterSim(diurnal_requests(args.peak_rps, day_s, args.prompt_scale), times, args.startup_s)
    with tempfile.TemporaryDirectory(prefix="planner-kwok-") as folder, ControlPlane(fake_nodes=args.nodes) as plane:
        cluster = Cluster(plane, NAMESPACE)
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
        if not wait_until(lambda: plane.kubectl("get", "inferenceclusters", f"--namespace={NAMESPACE}",
                                                check=False).returncode == 0, 60):
            raise RuntimeError("the CRD is not served")
        log = Path(folder) / "operator.log"
        operator = start_operator(plane.kubeconfig, log)
        try:
            if not wait_until(lambda: "waiting for lease" in log.read_text(errors="replace"), OPERATOR_START_S):
                raise RuntimeError(f"the operator did not start:\n{log.read_text(errors='replace')[-3000:]}")
            cluster.apply(autoscaled_cluster(example(), args))
            cluster.wait_phase(NAME, "Ready", timeout=300)
            kube = Kube(load_configuration(plane.kubeconfig))
            print(f"control plane, operator and cluster up in {time.perf_counter() - started:.0f} s", flush=True)
            timeline = run_day(kube, NAME, sim, args)
        except BaseException:
            print(f"the operator's log ends:\n{log.read_text(errors='replace')[-4000:]}", flush=True)
            raise
        finally:
            operator.terminate()
            operator.wait(timeout=30)
    sim.run_until(float("inf"))
    slo = Slo(args.ttft_target_s, args.itl_target_s)
    shares = attainment_by_interval(sim, slo, args.interval_s, len(timeline))
    timeline = [Interval(**{**asdict(i), "attainment": share}) for i, share in zip(timeline, shares, strict=True)]
    planner = outcome("planner (Autoscaler on kwok)", sim, slo, day_s)
    walls = sorted(i.wall_s for i in timeline)
    summary = {
        "peak_pods": max(sum(i.pods.values()) for i in timeline),
        "interval_wall_s_median": walls[len(walls) // 2],
        "interval_wall_s_max": walls[-1],
        "wall_s": round(time.perf_counter() - started, 1),
        "requests": len(sim.requests),
        "service_times": times.as_json(),
        "timeline": [asdict(interval) for interval in timeline],
    }
    print(planner.row(), {key: summary[key] for key in ("peak_pods", "interval_wall_s_median", "wall_s")})
    notes = [f"service times from {args.service_times}; workload and targets as planner_trace's",
             "kwok's pods turn Ready at once: the simulation keeps a new pod's /metrics silent for --startup-s"]
    folder = output_dir(args)
    result = new_result("planner_kwok", params_of(args, ("results_dir", "quick")), [planner.row()],
                        summary=summary, notes=notes)
    print(f"wrote {write_result(result, folder)}")
    plot(timeline, folder / "planner_kwok.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
