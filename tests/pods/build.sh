#!/usr/bin/env bash
# Builds the node binaries of the pods tier (a single-node Kubernetes with real pods, REAL_PODS.md):
# kubelet and kube-proxy from the same Kubernetes release as the test control plane (tests/cluster/build.sh)
# in a module of their own (tests/cluster/go/kubelet), CoreDNS from its module (tests/cluster/go/coredns) and
# kube-network-policies, which enforces NetworkPolicy on the node, from its own (tests/cluster/go/netpol) with
# one patch. Cached outside the checkout, keyed by the pinned versions and the patch, so a fresh clone reuses
# them and a version bump or a new patch rebuilds.
#
#   bash tests/pods/build.sh                  build whatever is missing
#   bash tests/pods/build.sh --print-bin-dir  print the folder the binaries are (or will be) in
set -euo pipefail

gomods="$(cd "$(dirname "${BASH_SOURCE[0]}")/../cluster/go" && pwd)"
source "$gomods/../go_build.sh"

k8s_version="$(pinned kubelet k8s.io/kubernetes)"
coredns_version="$(pinned coredns github.com/coredns/coredns)"
netpol_version="$(pinned netpol sigs.k8s.io/kube-network-policies)"
netpol_patch="$gomods/netpol/nfqueue-compat.patch"
netpol_key="${netpol_version}-$(sha256sum "$netpol_patch" | cut -c1-8)"
cache="${KVFERRY_CACHE:-$HOME/.cache/kvferry}"
bin_dir="$cache/pods-k8s-${k8s_version}-coredns-${coredns_version}-netpol-${netpol_key}/bin"

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

# kube-network-policies queues packets with nftables' `queue` expression, which this kind of machine's kernel
# lacks (CONFIG_NFT_QUEUE unset: "netlink receive: no such file or directory" at its first sync); the patch
# makes it use the xtables NFQUEUE target through nft_compat instead, which the kernel has. The module's
# source, patched, goes into a temporary folder that replaces the module in a copy of tests/cluster/go/netpol.
if [[ ! -x "$bin_dir/kube-network-policies" ]]; then
    netpol_build="$(mktemp -d)"
    trap 'rm -rf "$netpol_build"' EXIT
    cp "$gomods/netpol/go.mod" "$gomods/netpol/go.sum" "$netpol_build/"
    upstream="$(cd "$netpol_build" && go mod download -json "sigs.k8s.io/kube-network-policies@$netpol_version" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
    cp -r "$upstream" "$netpol_build/upstream"
    chmod -R u+w "$netpol_build/upstream"
    patch --quiet -p1 -d "$netpol_build/upstream" <"$netpol_patch"
    (cd "$netpol_build" && go mod edit -replace sigs.k8s.io/kube-network-policies=./upstream)
    # Its main package is the module's cmd/ folder; the binary takes the project's name.
    go_build kube-network-policies "$netpol_build" "$netpol_key" sigs.k8s.io/kube-network-policies/cmd ""
fi
echo "pods-tier binaries ready in $bin_dir"
