#!/usr/bin/env bash
# Builds the node binaries of the pods tier (a single-node Kubernetes with real pods, REAL_PODS.md):
# kubelet and kube-proxy from the same Kubernetes release as the test control plane (tests/cluster/build.sh)
# in a module of their own (tests/cluster/go/kubelet), and CoreDNS from its module (tests/cluster/go/coredns). Cached outside the
# checkout, keyed by the pinned versions, so a fresh clone reuses them and a version bump rebuilds.
#
#   bash tests/pods/build.sh                  build whatever is missing
#   bash tests/pods/build.sh --print-bin-dir  print the folder the binaries are (or will be) in
set -euo pipefail

gomods="$(cd "$(dirname "${BASH_SOURCE[0]}")/../cluster/go" && pwd)"

pinned() {
    awk -v mod="$2" '$1 == mod && $2 ~ /^v/ { print $2; exit }' "$gomods/$1/go.mod"
}

k8s_version="$(pinned kubelet k8s.io/kubernetes)"
coredns_version="$(pinned coredns github.com/coredns/coredns)"
cache="${KVFERRY_CACHE:-$HOME/.cache/kvferry}"
bin_dir="$cache/pods-k8s-${k8s_version}-coredns-${coredns_version}/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
    echo "$bin_dir"
    exit 0
fi

tools=(kubelet kube-proxy coredns)
missing=0
for tool in "${tools[@]}"; do
    [[ -x "$bin_dir/$tool" ]] || missing=1
done
[[ $missing -eq 1 ]] || exit 0

command -v go >/dev/null || { echo "build.sh: needs Go (1.26 or newer) on PATH" >&2; exit 1; }
mkdir -p "$bin_dir"
exec 9>"$bin_dir/.build.lock"
flock 9

go_build() {
    local tool="$1" module="$2" version="$3" package="$4" ldflags="$5"
    [[ -x "$bin_dir/$tool" ]] && return 0
    local start=$SECONDS
    echo "building $tool $version ..."
    (
        cd "$gomods/$module"
        CGO_ENABLED=0 GOFLAGS=-trimpath nice -n 10 \
            go build -p 2 -ldflags "-s -w $ldflags" -o "$bin_dir/.$tool.partial" "$package"
    )
    mv "$bin_dir/.$tool.partial" "$bin_dir/$tool"
    echo "building $tool $version ... done in $((SECONDS - start))s"
}

k8s_minor="${k8s_version#v1.}"
k8s_minor="${k8s_minor%%.*}"
k8s_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $pkg.gitTreeState=clean"
done

for tool in kubelet kube-proxy; do
    go_build "$tool" kubelet "$k8s_version" "k8s.io/kubernetes/cmd/$tool" "$k8s_ldflags"
done
go_build coredns coredns "$coredns_version" github.com/coredns/coredns ""
echo "pods-tier binaries ready in $bin_dir"
