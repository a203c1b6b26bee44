#!/usr/bin/env bash
# Builds the binaries of the test control plane (tests/cluster/README.md) into a cache folder outside the
# checkout, keyed by the pinned versions, so a fresh clone reuses them and a version bump rebuilds.
#
#   bash tests/cluster/build.sh                  build whatever is missing
#   bash tests/cluster/build.sh --print-bin-dir  print the folder the binaries are (or will be) in
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gomods="$here/go"

# The version a go.mod pins for a module; read from the file, not `go list`, to keep the fast path fast.
pinned() {
    awk -v mod="$2" '$1 == mod && $2 ~ /^v/ { print $2; exit }' "$gomods/$1/go.mod"
}

k8s_version="$(pinned kubernetes k8s.io/kubernetes)"
kwok_version="$(pinned kwok sigs.k8s.io/kwok)"
helm_version="$(pinned helm helm.sh/helm/v4)"
etcd_version="$(pinned etcd go.etcd.io/etcd/server/v3)"

cache="${KVFERRY_CACHE:-$HOME/.cache/kvferry}"
cluster_dir="$cache/cluster-k8s-${k8s_version}-etcd-${etcd_version}-kwok-${kwok_version}-helm-${helm_version}"
bin_dir="$cluster_dir/bin"
# kwok's Stages (how a fake node and its pods move through their lifecycle), from the pinned kwok.
kwok_stages="$cluster_dir/kwok-stages.yaml"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
    echo "$bin_dir"
    exit 0
fi

tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok helm)

all_present() {
    local tool
    for tool in "${tools[@]}"; do
        [[ -x "$bin_dir/$tool" ]] || return 1
    done
    [[ -f "$kwok_stages" ]]
}

if all_present; then
    exit 0
fi

command -v go >/dev/null || { echo "build.sh: needs Go (1.26 or newer) on PATH" >&2; exit 1; }
mkdir -p "$bin_dir"
# Two builds at once (say `make test` in two shells) would only slow each other down on two cores.
exec 9>"$bin_dir/.build.lock"
flock 9

# `go build` writes into a temporary name that is renamed at the end, so an interrupted build never
# leaves a binary behind that the next run would take as done.
go_build() {
    local tool="$1" module="$2" version="$3" package="$4" ldflags="$5"
    [[ -x "$bin_dir/$tool" ]] && return 0
    local start=$SECONDS
    echo "building $tool $version ..."
    (
        cd "$gomods/$module"
        # nice: the machine has two cores and other work (tests, editors) must keep going.
        CGO_ENABLED=0 GOFLAGS=-trimpath nice -n 10 \
            go build -p 2 -ldflags "-s -w $ldflags" -o "$bin_dir/.$tool.partial" "$package"
    )
    mv "$bin_dir/.$tool.partial" "$bin_dir/$tool"
    echo "building $tool $version ... done in $((SECONDS - start))s"
}

# Release builds stamp their version in with -X; without it the servers report v0.0.0-master and
# kubectl warns about the version skew.
k8s_minor="${k8s_version#v1.}"
k8s_minor="${k8s_minor%%.*}"
k8s_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $pkg.gitTreeState=clean"
done

go_build etcd etcd "$etcd_version" go.etcd.io/etcd/server/v3 ""
for tool in kube-apiserver kube-controller-manager kube-scheduler; do
    go_build "$tool" kubernetes "$k8s_version" "k8s.io/kubernetes/cmd/$tool" "$k8s_ldflags"
done
go_build kwok kwok "$kwok_version" sigs.k8s.io/kwok/cmd/kwok ""
go_build helm helm "$helm_version" helm.sh/helm/v4/cmd/helm \
    "-X helm.sh/helm/v4/internal/version.version=$helm_version"

# kwok's "fast" stages: nodes turn Ready and renew their leases, pods turn Running and
# Ready at once, a Job's pods succeed, and a deleted pod is removed (there is no kubelet to do it).
if [[ ! -f "$kwok_stages" ]]; then
    kwok_src="$(cd "$gomods/kwok" && go mod download -json sigs.k8s.io/kwok | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
        pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
        echo "---"
        cat "$kwok_src/kustomize/stage/$stage.yaml"
    done > "$kwok_stages.partial"
    mv "$kwok_stages.partial" "$kwok_stages"
fi
echo "cluster binaries ready in $bin_dir"
