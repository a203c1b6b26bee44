#!/usr/bin/env bash
# Builds the node binaries of the pods tier (a single-node Kubernetes with real pods, REAL_PODS.md):
# kubelet and kube-proxy from the same Kubernetes release as the test control plane (tests/cluster/build.sh)
# in a module of their own (tests/cluster/go/kubelet), CoreDNS from its module (tests/cluster/go/coredns) and
# kube-network-policies, which enforces NetworkPolicy on the node, from its own (tests/cluster/go/netpol). Cached outside the
# checkout, keyed by the pinned versions, so a fresh clone reuses them and a version bump rebuilds.
#
#   bash tests/pods/build.sh                  build whatever is missing
#   bash tests/pods/build.sh --print-bin-dir  print the folder the binaries are (or will be) in
set -euo pipefail

gomods="$(cd "$(dirname "${BASH_SOURCE[0]}")/../cluster/go" && pwd)"
source "$gomods/../go_build.sh"

k8s_version="$(pinned kubelet k8s.io/kubernetes)"
coredns_version="$(pinned coredns github.com/coredns/coredns)"
netpol_version="$(pinned netpol sigs.k8s.io/kube-network-policies)"
cache="${KVFERRY_CACHE:-$HOME/.cache/kvferry}"
bin_dir="$cache/pods-k8s-${k8s_version}-coredns-${coredns_version}-netpol-${netpol_version}/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
    echo "$bin_dir"
    exit 0
fi

tools=(kubelet kube-proxy coredns kube-network-policies)
missing=0
for tool in "${tools[@]}"; do
    [[ -x "$bin_dir/$tool" ]] || missing=1
done
[[ $missing -eq 1 ]] || exit 0

start_building

for tool in kubelet kube-proxy; do
    go_build "$tool" kubelet "$k8s_version" "k8s.io/kubernetes/cmd/$tool" "$(k8s_ldflags "$k8s_version")"
done
go_build coredns coredns "$coredns_version" github.com/coredns/coredns ""
# Its main package is the module's cmd/ folder; the binary takes the project's name.
go_build kube-network-policies netpol "$netpol_version" sigs.k8s.io/kube-network-policies/cmd ""
echo "pods-tier binaries ready in $bin_dir"
