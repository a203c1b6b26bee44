#!/usr/bin/env bash
# `make k8s-up`: the Kubernetes path on this one machine, without a cloud or a registry. Brings up the
# single-node cluster with real pods (tests/pods/node.sh), imports the image `make image` built, installs
# the chart with its example InferenceCluster (the tiny model inside the image), waits until it is Ready
# and prints the router's URL and a curl line. `make k8s-down` removes all of it.
#
#   bash tests/pods/k8s-up.sh DIR
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="${1:?usage: k8s-up.sh DIR}"
export KUBECONFIG="$dir/admin.kubeconfig"
helm="$(bash "$repo/tests/cluster/build.sh" --print-bin-dir)/helm"
image="$(bash "$repo/image/build.sh" --print-ref)"
namespace=kvferry
cluster=example

if ! kubectl get node >/dev/null 2>&1; then
    echo "starting the single-node cluster in $dir ..."
    bash "$here/node.sh" up "$dir"
fi
echo "importing $image into the node's containerd ..."
bash "$here/node.sh" import "$dir" "$image"
echo "installing the chart with its example cluster ..."
"$helm" upgrade --install kvferry "$repo/charts/kvferry" --namespace "$namespace" --create-namespace \
    --set exampleCluster.enabled=true --set "exampleCluster.name=$cluster" --wait --timeout 10m >/dev/null
echo "waiting for InferenceCluster $cluster to be Ready ..."
kubectl --namespace "$namespace" wait "inferencecluster/$cluster" --for=jsonpath='{.status.phase}'=Ready --timeout=15m >/dev/null
router="$(kubectl --namespace "$namespace" get service "$cluster-router" -o jsonpath='{.spec.clusterIP}:{.spec.ports[0].port}')"
model="$(kubectl --namespace "$namespace" get inferencecluster "$cluster" -o jsonpath='{.spec.model.servedName}')"
cat <<TEXT
Ready. The router's Service: http://$router (KUBECONFIG=$KUBECONFIG)
  curl http://$router/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$model", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'
\`make k8s-down\` removes the cluster.
TEXT
