#!/usr/bin/env bash
# A single-node Kubernetes with real pods on this machine (REAL_PODS.md): etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler (tests/cluster/build.sh), kubelet, kube-proxy, CoreDNS and
# kube-network-policies (tests/pods/build.sh), Debian's containerd, runc and CNI plugins. Everything lives in one folder and
# on one bridge the script makes (kvf0, 10.244.0.1/24): the apiserver, the kubelet and CoreDNS bind to the
# bridge's address, the rest to 127.0.0.1. containerd's image store stays in the kvferry cache
# ($KVFERRY_CACHE/pods-images), so an image is imported once per machine, not once per run; whatever
# else a run makes (containers, their snapshots, pod sandboxes) is removed by `down`.
#
#   bash tests/pods/node.sh up DIR      start it; DIR/admin.kubeconfig reaches it
#   bash tests/pods/node.sh import DIR REF...   import podman images into its containerd
#   bash tests/pods/node.sh down DIR    stop it and remove every process, mount, interface, iptables rule,
#                                       nftables table and cgroup it made, then DIR
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BRIDGE=kvf0
NODE_IP=10.244.0.1
POD_SUBNET=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
APISERVER_PORT=6443
NODE_NAME=kvferry-node
PAUSE_IMAGE=localhost/kvferry-pause:1
image_store="${KVFERRY_CACHE:-$HOME/.cache/kvferry}/pods-images"

cluster_bin="$(bash "$here/../cluster/build.sh" --print-bin-dir)"
pods_bin="$(bash "$here/build.sh" --print-bin-dir)"

start() {  # name, log, argv...: a process in its own session, its pid in DIR/pids
    local name="$1"
    shift
    setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
    echo "$! $name" >>"$dir/pids"
}

wait_for() {  # what, timeout seconds, command...
    local what="$1" timeout="$2"
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS > deadline)); then
            echo "node.sh: $what not ready after ${timeout}s" >&2
            return 1
        fi
        sleep 0.5
    done
}

pki() {
    local pki="$dir/pki"
    mkdir -p "$pki"
    openssl req -x509 -new -nodes -days 7 -subj "/CN=kvferry-pods-ca" -newkey ec \
        -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$pki/ca.key" -out "$pki/ca.crt" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    issue() {  # name, subject, sans
        openssl req -new -nodes -subj "$2" -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
            -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
        printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n%s\n' \
            "${3:+subjectAltName=$3}" >"$pki/$1.ext"
        openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 7 \
            -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
    }
    issue apiserver "/CN=kube-apiserver" \
        "IP:$NODE_IP,IP:$SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    issue admin "/O=system:masters/CN=kvferry-admin"
    issue kubelet "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
    openssl ecparam -genkey -noout -name prime256v1 -out "$pki/service-account.key"
    kubectl config --kubeconfig="$dir/admin.kubeconfig" set-cluster pods --server="https://$NODE_IP:$APISERVER_PORT" \
        --certificate-authority="$pki/ca.crt" --embed-certs >/dev/null
    kubectl config --kubeconfig="$dir/admin.kubeconfig" set-credentials admin --client-certificate="$pki/admin.crt" \
        --client-key="$pki/admin.key" --embed-certs >/dev/null
    kubectl config --kubeconfig="$dir/admin.kubeconfig" set-context pods --cluster=pods --user=admin >/dev/null
    kubectl config --kubeconfig="$dir/admin.kubeconfig" use-context pods >/dev/null
}

network() {
    ip link add "$BRIDGE" type bridge
    # The bridge names its node's folder, so that a later `up` can tell a live node from one whose run was
    # killed before its `down` (and clean up after the latter).
    ip link set "$BRIDGE" alias "$dir"
    ip addr add "$NODE_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    sysctl -qw net.ipv4.ip_forward=1
    modprobe br_netfilter 2>/dev/null || true
    mkdir -p "$dir/cni/net.d"
    cat >"$dir/cni/net.d/10-kvferry.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "kvferry-pods", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$NODE_IP"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$dir/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOF
}

control_plane() {
    local etcd_url="http://127.0.0.1:$(free_port)" peer_url="http://127.0.0.1:$(free_port)"
    start etcd "$cluster_bin/etcd" --name=default --data-dir="$dir/etcd" --listen-client-urls="$etcd_url" \
        --advertise-client-urls="$etcd_url" --listen-peer-urls="$peer_url" \
        --initial-advertise-peer-urls="$peer_url" --initial-cluster="default=$peer_url" --unsafe-no-fsync \
        --log-level=warn
    wait_for etcd 60 curl -fsS "$etcd_url/health"
    start kube-apiserver "$cluster_bin/kube-apiserver" --etcd-servers="$etcd_url" --bind-address="$NODE_IP" \
        --advertise-address="$NODE_IP" --secure-port="$APISERVER_PORT" \
        --tls-cert-file="$dir/pki/apiserver.crt" --tls-private-key-file="$dir/pki/apiserver.key" \
        --client-ca-file="$dir/pki/ca.crt" --kubelet-client-certificate="$dir/pki/admin.crt" \
        --kubelet-client-key="$dir/pki/admin.key" --kubelet-preferred-address-types=InternalIP \
        --authorization-mode=Node,RBAC \
        --service-account-key-file="$dir/pki/service-account.key" \
        --service-account-signing-key-file="$dir/pki/service-account.key" \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true --profiling=false
    wait_for kube-apiserver 120 kubectl --kubeconfig="$dir/admin.kubeconfig" get --raw /readyz
    start kube-controller-manager "$cluster_bin/kube-controller-manager" --kubeconfig="$dir/admin.kubeconfig" \
        --authentication-kubeconfig="$dir/admin.kubeconfig" --authorization-kubeconfig="$dir/admin.kubeconfig" \
        --bind-address=127.0.0.1 --secure-port="$(free_port)" --leader-elect=false \
        --use-service-account-credentials=true --service-account-private-key-file="$dir/pki/service-account.key" \
        --root-ca-file="$dir/pki/ca.crt" --cluster-signing-cert-file="$dir/pki/ca.crt" \
        --cluster-signing-key-file="$dir/pki/ca.key" --cert-dir="$dir/controller-manager"
    start kube-scheduler "$cluster_bin/kube-scheduler" --kubeconfig="$dir/admin.kubeconfig" \
        --authentication-kubeconfig="$dir/admin.kubeconfig" --authorization-kubeconfig="$dir/admin.kubeconfig" \
        --bind-address=127.0.0.1 --secure-port="$(free_port)" --leader-elect=false
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

runtime() {
    mkdir -p "$dir/containerd"
    cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$image_store"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
    start containerd containerd --config "$dir/containerd/config.toml"
    wait_for containerd 60 ctr --address "$dir/containerd/containerd.sock" version
}

import_images() {
    export CONTAINERS_CONF="${KVFERRY_CACHE:-$HOME/.cache/kvferry}/podman/containers.conf"
    local ref
    for ref in "$@"; do
        local id marker sock="$dir/containerd/containerd.sock"
        id="$(podman image inspect --format '{{ .Id }}' "$ref")"
        marker="$image_store/imported-$(echo "$ref" | tr '/:' '__')"
        if ctr --address "$sock" -n k8s.io images ls -q | grep -qx "$ref" && \
            [[ "$(cat "$marker" 2>/dev/null)" == "$id" ]]; then
            continue
        fi
        local start=$SECONDS previous="$ref-previous"
        # Unpacked at once onto the snapshots of the layers it shares with the image it replaces, so that a
        # rebuild after a code change unpacks one small layer. Until the new image is unpacked, only the
        # old one holds those snapshots, and the import moves the name off it: a garbage collection in
        # between (any deletion triggers one) took them from under the unpack ("parent snapshot ... does
        # not exist"). A second name holds the old image until the new one is unpacked.
        ctr --address "$sock" -n k8s.io images tag --force "$ref" "$previous" >/dev/null 2>&1 || true
        oci_archive "$ref" | ctr --address "$sock" -n k8s.io images import --snapshotter overlayfs - >/dev/null
        rm -rf "$dir/oci-layout"
        # Then the old image goes, by that name and by its id (the name the kubelet may know it by), so that
        # containerd collects its own layers and snapshots at once (each rebuild would leave 6 GB otherwise).
        ctr --address "$sock" -n k8s.io images rm --sync "$previous" >/dev/null 2>&1 || true
        local replaced
        replaced="$(cat "$marker" 2>/dev/null || true)"
        if [[ -n "$replaced" && "$replaced" != "$id" ]]; then
            ctr --address "$sock" -n k8s.io images rm --sync "sha256:$replaced" >/dev/null 2>&1 || true
        fi
        echo "$id" >"$marker"
        echo "imported $ref into the node's containerd in $((SECONDS - start))s"
    done
}

oci_archive() {  # REF: an OCI archive of the image on stdout, holding only the layers containerd lacks
    # `podman save` streamed all 6 GB of the image each time (90-150 s a changed image here, 46 s of it the
    # save alone); skopeo writes an OCI layout instead, and skips each blob the layout already
    # has. Linking containerd's own blobs into it first makes those the layers that containerd holds: it
    # named the ones it imported by their uncompressed digest, as skopeo names uncompressed layers.
    local ref="$1" layout="$dir/oci-layout" sock="$dir/containerd/containerd.sock"
    local content="$image_store/io.containerd.content.v1.content/blobs/sha256"
    rm -rf "$layout"
    mkdir -p "$layout/blobs/sha256"
    if [[ -d "$content" ]]; then
        # Hard links (another file system: no links, and skopeo writes every layer, as on a new machine).
        find "$content" -maxdepth 1 -type f -exec ln -t "$layout/blobs/sha256" {} + 2>/dev/null || true
    fi
    # (containers/storage logs its driver choice at info level, which --quiet leaves in.)
    skopeo copy --quiet --dest-oci-accept-uncompressed-layers "containers-storage:$ref" "oci:$layout:image" \
        2> >(grep -v 'level=info msg="\[graphdriver\]' >&2)
    # What this namespace's metadata lists, not the files: containerd unpacks only from content it knows.
    ctr --address "$sock" -n k8s.io content ls -q | python3 "$here/oci_archive.py" "$layout" image "$ref"
}

pause_image() {
    export CONTAINERS_CONF="${KVFERRY_CACHE:-$HOME/.cache/kvferry}/podman/containers.conf"
    if ! podman image exists "$PAUSE_IMAGE"; then
        local base
        base="$(podman images --format '{{ .Repository }}:{{ .Tag }}' | grep -m1 '^localhost/kvferry-base:')"
        printf 'FROM %s\nCMD ["sleep", "infinity"]\n' "$base" | podman build --quiet --tag "$PAUSE_IMAGE" - >/dev/null
    fi
    import_images "$PAUSE_IMAGE"
}

node() {
    printf 'nameserver %s\n' "$(awk '/^nameserver/ { print $2; exit }' /etc/resolv.conf)" >"$dir/upstream-resolv.conf"
    cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $dir/pki/kubelet.crt
tlsPrivateKeyFile: $dir/pki/kubelet.key
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $dir/pki/ca.crt}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $dir/upstream-resolv.conf
evictionHard: {memory.available: "1%", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
serializeImagePulls: false
EOF
    start kubelet "$pods_bin/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$dir/admin.kubeconfig" \
        --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --root-dir="$dir/kubelet"
    start kube-proxy "$pods_bin/kube-proxy" --kubeconfig="$dir/admin.kubeconfig" --hostname-override="$NODE_NAME" \
        --proxy-mode=iptables --cluster-cidr="$POD_SUBNET" --bind-address="$NODE_IP" \
        --healthz-bind-address="127.0.0.1:$(free_port)" --metrics-bind-address="127.0.0.1:$(free_port)" \
        --conntrack-max-per-core=0
    cat >"$dir/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $dir/admin.kubeconfig pods
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . $(awk '/^nameserver/ { print $2; exit }' /etc/resolv.conf)
    cache 30
}
EOF
    start coredns "$pods_bin/coredns" -conf "$dir/Corefile"
    wait_for "the node Ready" 180 sh -c \
        "kubectl --kubeconfig='$dir/admin.kubeconfig' get node '$NODE_NAME' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
}

# NetworkPolicy: the bridge CNI enforces none, so kube-network-policies (the Kubernetes SIG's agent) runs
# beside it as a host process. It queues each new connection to or from a pod that a policy selects
# (nftables, then nfqueue) and decides it in user space; traffic root makes on the node (the kubelet's probes,
# the tests' own calls) passes untouched. It knows only the in-cluster configuration (the apiserver from
# KUBERNETES_SERVICE_HOST/PORT, a ServiceAccount token and the CA from
# /var/run/secrets/kubernetes.io/serviceaccount/), so it runs in a mount namespace of its own, where a
# tmpfs over /run holds those files and the host's /run is left as it was. --v=2 logs each connection's verdict
# (a few lines per new connection), what a test that saw one go unanswered prints (real_node.policy_verdicts).
NETPOL_TABLE=kube-network-policies
network_policies() {
    kubectl --kubeconfig="$dir/admin.kubeconfig" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-network-policies, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kube-network-policies}
rules:
  - {apiGroups: [""], resources: [pods, namespaces, nodes], verbs: [list, watch]}
  - {apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-network-policies}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-network-policies}
subjects: [{kind: ServiceAccount, name: kube-network-policies, namespace: kube-system}]
EOF
    local account="$dir/netpol-account"
    mkdir -p "$account"
    cp "$dir/pki/ca.crt" "$account/ca.crt"
    kubectl --kubeconfig="$dir/admin.kubeconfig" --namespace=kube-system create token kube-network-policies \
        --duration=24h >"$account/token"
    local secrets=/run/secrets/kubernetes.io/serviceaccount
    KUBERNETES_SERVICE_HOST="$NODE_IP" KUBERNETES_SERVICE_PORT="$APISERVER_PORT" \
        start kube-network-policies unshare --mount sh -c \
        "mount -t tmpfs -o mode=0755 kvferry-netpol /run && mkdir -p $secrets && cp '$account'/* $secrets/ &&
         exec '$pods_bin/kube-network-policies' --hostname-override=$NODE_NAME --disable-nri --v=2 \
             --metrics-bind-address=127.0.0.1:$(free_port)"
    wait_for kube-network-policies 60 nft list table inet "$NETPOL_TABLE"
}

alive() {  # every process started is still running, or its log says why not
    local pid name
    while read -r pid name; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "node.sh: $name exited; its log ends:" >&2
            tail -n 20 "$dir/logs/$name.log" >&2
            return 1
        fi
    done <"$dir/pids"
}

firewall_cleanup() {
    # Every rule the kubelet, kube-proxy and the CNI plugins made (their chains are named KUBE-* and CNI-*),
    # in both address families and both iptables back ends: the jumps from the built-in chains, then the
    # chains themselves. `-S` prints rules shell-quoted, hence eval.
    local tool table rule chain chains
    for tool in iptables ip6tables iptables-legacy ip6tables-legacy; do
        command -v "$tool" >/dev/null || continue
        for table in filter nat mangle; do
            "$tool" -t "$table" -S >/dev/null 2>&1 || continue
            "$tool" -t "$table" -S 2>/dev/null | \
                grep -E '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j (KUBE-|CNI-)' | \
                while read -r rule; do eval "$tool -t $table ${rule/-A/-D}" 2>/dev/null || true; done || true
            chains="$("$tool" -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE-|CNI-)/ { print $2 }')"
            for chain in $chains; do "$tool" -t "$table" -F "$chain" 2>/dev/null || true; done
            for chain in $chains; do "$tool" -t "$table" -X "$chain" 2>/dev/null || true; done
        done
    done
}

down() {
    if [[ -f "$dir/pids" ]]; then
        # kubelet first, so that nothing restarts the containers stopped below.
        for name in kubelet kube-proxy coredns kube-network-policies kube-scheduler kube-controller-manager kube-apiserver etcd; do
            awk -v n="$name" '$2 == n { print $1 }' "$dir/pids" | xargs -r kill 2>/dev/null || true
            [[ "$name" == kubelet ]] && sleep 1
        done
    fi
    local sock="$dir/containerd/containerd.sock"
    if [[ -S "$sock" ]]; then
        local task
        for task in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
        done
        sleep 1
        for task in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "$sock" -n k8s.io tasks delete -f "$task" >/dev/null 2>&1 || true
        done
        # Containers and pod sandboxes with their snapshots: the image store outlives the run, they do not.
        local container
        for container in $(ctr --address "$sock" -n k8s.io containers ls -q 2>/dev/null); do
            ctr --address "$sock" -n k8s.io containers delete "$container" >/dev/null 2>&1 || true
        done
    fi
    [[ -f "$dir/pids" ]] && awk '$2 == "containerd" { print $1 }' "$dir/pids" | xargs -r kill 2>/dev/null || true
    # containerd-shim processes outlive containerd by design; theirs end with their containers.
    pkill -f "containerd-shim.*$dir" 2>/dev/null || true
    sleep 1
    [[ -f "$dir/pids" ]] && awk '{ print $1 }' "$dir/pids" | xargs -r kill -9 2>/dev/null || true
    # Pod sandboxes' network namespaces and every mount under the folder (volumes, rootfs, shm).
    grep -o " $dir[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    local netns
    for netns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ { print $1 }'); do
        ip netns delete "$netns" 2>/dev/null || true
    done
    "$pods_bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
    firewall_cleanup
    # kube-network-policies removes its table on SIGINT only; killed, it leaves it (and the table's queue,
    # with no reader, would drop every packet it holds).
    nft delete table inet "$NETPOL_TABLE" 2>/dev/null || true
    local port
    for port in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{ split($2, a, "@"); print a[1] }'); do
        ip link delete "$port" 2>/dev/null || true
    done
    ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
    # The kubelet's cgroups (cgroupfs driver): kubepods under each controller.
    find /sys/fs/cgroup -depth -type d -path '*kubepods*' -exec rmdir {} \; 2>/dev/null || true
    rm -rf "$dir"
}

stale_node() {  # the bridge exists: refuse if its node still runs, else remove what that node left
    local owner
    owner="$(cat "/sys/class/net/$BRIDGE/ifalias" 2>/dev/null || true)"
    if [[ -z "$owner" ]] || node_running "$owner"; then
        echo "node.sh: the bridge $BRIDGE exists: another node is up (bash tests/pods/node.sh down ${owner:-ITS_DIR})" >&2
        exit 1
    fi
    echo "node.sh: the node in $owner has no process left (its run was killed); removing what it left" >&2
    local own_dir="$dir"
    dir="$owner"
    down
    dir="$own_dir"
}

node_running() {  # folder: a process the node in it started still runs
    local folder="$1" pid
    if [[ -f "$folder/pids" ]]; then
        while read -r pid _; do
            kill -0 "$pid" 2>/dev/null && return 0
        done <"$folder/pids"
    fi
    pgrep -f -- "$folder" >/dev/null
}

command="${1:-}"
dir="${2:-}"
[[ -n "$command" && -n "$dir" ]] || { sed -n '2,12p' "$0" >&2; exit 2; }
case "$command" in
    up)
        mkdir -p "$dir/logs" "$image_store"
        dir="$(cd "$dir" && pwd)"
        if ip link show "$BRIDGE" >/dev/null 2>&1; then
            stale_node
        fi
        pki
        network
        control_plane
        runtime
        pause_image
        node
        network_policies
        alive
        echo "node $NODE_NAME Ready; KUBECONFIG=$dir/admin.kubeconfig"
        ;;
    import)
        dir="$(cd "$dir" && pwd)"
        shift 2
        import_images "$@"
        ;;
    down)
        [[ -d "$dir" ]] || exit 0
        dir="$(cd "$dir" && pwd)"
        down
        ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
