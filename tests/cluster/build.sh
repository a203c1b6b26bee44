#!/usr/bin/env bash
# Builds the binaries of the test control plane (tests/cluster/README.md) into a cache folder outside the
# checkout, keyed by the pinned versions, so a fresh clone reuses them and a version bump rebuilds.
#
#   bash tests/cluster/build.sh                  build whatever is missing
#   bash tests/cluster/build.sh --print-bin-dir  print the folder the binaries are (or will be) in
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gomods="$here/go"

source "$here/go_build.sh"

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

start_building
k8s_flags="$(k8s_ldflags "$k8s_version")"

go_build etcd etcd "$etcd_version" go.etcd.io/etcd/server/v3 ""
for tool in kube-apiserver kube-controller-manager kube-scheduler; do
    go_build "$tool" kubernetes "$k8s_version" "k8s.io/kubernetes/cmd/$tool" "$k8s_flags"
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
