"""`kvferry operator`: run the InferenceCluster operator (in-cluster, or with a kubeconfig)."""

from __future__ import annotations

import argparse
import os
import socket

from kvferry.logs import FORMAT_ENV, LOG_FORMATS

DEFAULT_LEASE_NAME = "kvferry-operator"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the Kubernetes operator for InferenceCluster resources",
        description="Reconcile InferenceCluster resources into prefill, decode and router Deployments.",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster service account, then ~/.kube/config)"
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NAMESPACE",
        help="watch this namespace (repeatable); default: every namespace",
    )
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace (the default)")
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="skip leader election: only for a single replica, e.g. running from a workstation",
    )
    parser.add_argument(
        "--lease-name", default=DEFAULT_LEASE_NAME, help="leader-election Lease (default: %(default)s)"
    )
    parser.add_argument(
        "--lease-namespace",
        help="namespace of the Lease (default: $POD_NAMESPACE, else the first --namespace, else default)",
    )
    parser.add_argument("--lease-duration", type=float, default=15.0, help="seconds a leader's lease lasts")
    parser.add_argument(
        "--identity", help="this replica's name in the Lease (default: $POD_NAME, else host-pid)"
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=60.0,
        help="re-apply every cluster this often, restoring children changed by hand",
    )
    parser.add_argument(
        "--autoscale-seconds",
        type=float,
        default=30.0,
        help="the autoscaling planner's interval: scrape, decide, apply, for clusters with autoscaling",
    )
    parser.add_argument("--health-host", default="0.0.0.0", help="address of the /healthz endpoint")
    parser.add_argument("--health-port", type=int, default=0, help="port of the /healthz endpoint (0: off)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=os.environ.get(FORMAT_ENV, "text"),
                        help=f"text, or json: kopf's JSON lines, one object a line (default ${FORMAT_ENV}, else text)")
    parser.add_argument(
        "--test-hook-apply-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="TEST HOOK: sleep between child applies, so tests can kill the operator mid-reconcile",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here so that `kvferry --help` does not load kopf and the Kubernetes client.
    import kopf

    from kvferry.operator.certificates import MIN_SEED_BYTES
    from kvferry.operator.internal_tls import SEED_ENV
    from kvferry.operator.reconcile import ReconcileSettings
    from kvferry.operator.runner import OperatorConfig, run_operator

    seed = os.environ.get(SEED_ENV, "").encode() or None
    if seed is not None and len(seed) < MIN_SEED_BYTES:
        raise SystemExit(f"kvferry operator: ${SEED_ENV} must hold at least {MIN_SEED_BYTES} bytes")

    kopf.configure(verbose=args.verbose,
                   log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL)
    namespaces = tuple(args.namespaces or ())
    lease_namespace = (
        args.lease_namespace or os.environ.get("POD_NAMESPACE") or (namespaces or ("default",))[0]
    )
    config = OperatorConfig(
        kubeconfig=args.kubeconfig,
        namespaces=namespaces,
        leader_election=not args.standalone,
        lease_name=args.lease_name,
        lease_namespace=lease_namespace,
        lease_duration_s=args.lease_duration,
        identity=args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
        # The pod's uid (downward API) only with the pod's own name as the identity: the owner reference names both.
        pod_uid=os.environ.get("POD_UID") if not args.identity else None,
        resync_s=args.resync_seconds,
        autoscale_s=args.autoscale_seconds,
        health_host=args.health_host,
        health_port=args.health_port,
        reconcile=ReconcileSettings(test_hook_apply_delay_s=args.test_hook_apply_delay, signing_seed=seed),
    )
    return run_operator(config)
