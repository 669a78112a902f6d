#!/usr/bin/env bash
# A single-node Kubernetes for tests and for trying Skiff by hand:
#   cluster.sh up      start (or find running) etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#                      containerd + runc, a kubelet with CNI bridge networking, kube-proxy (iptables) and a
#                      Service DNS; import the images of images.sh; print the admin kubeconfig's path
#   cluster.sh down    delete every pod, stop each process by its recorded PID, unmount, remove cgroups,
#                      links and iptables rules; images and etcd data stay for the next `up`
#   cluster.sh purge   down, then remove all state
#   cluster.sh env     print `export KUBECONFIG=...`
# All state lives under $SKIFF_CLUSTER_DIR (default ~/.cache/skiff-cluster/run). Runs as root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
D="$CLUSTER_DIR"
NODE=skiff-node
NODE_IP=10.254.254.1       # on NODE_LINK, a port-less bridge: the kubelet refuses a loopback node IP
NODE_LINK=skiffnode0
POD_CIDR=10.244.77.0/24    # the CNI bridge
POD_LINK=skiffcni0
SVC_CIDR=10.96.0.0/16
SVC_API_IP=10.96.0.1    # the `kubernetes` Service, first address of SVC_CIDR
API_PORT=16443
ETCD_PORT=12379
FAKE_GPUS=8
K="$D/kubeconfig"

pidfile() { echo "$D/pids/$1.pid"; }
alive() { [[ -s $(pidfile "$1") ]] && kill -0 "$(cat "$(pidfile "$1")")" 2>/dev/null; }
start() {  # NAME CMD...: runs in the background, logs under $D/logs, PID recorded
  local name=$1; shift
  alive "$name" && return 0
  setsid "$@" >"$D/logs/$name.log" 2>&1 < /dev/null &
  echo $! >"$(pidfile "$name")"
}
wait_for() {  # WHAT SECONDS CMD...
  local what=$1 limit=$2; shift 2
  local t0=$SECONDS
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < limit)) || { log "timed out waiting for $what"; tail -n 20 "$D"/logs/*.log >&2; exit 1; }
    sleep 0.5
  done
}
kc() { kubectl --kubeconfig "$K" "$@"; }
clear_containers() {  # every container of the k8s.io namespace: tasks killed, then the records removed
  local sock="$D/containerd/containerd.sock" pass c
  for pass in 1 2; do  # a second pass takes what the first could not while its sandbox still ran
    for c in $(ctr -a "$sock" -n k8s.io containers ls -q 2>/dev/null); do
      ctr -a "$sock" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true
      ctr -a "$sock" -n k8s.io tasks delete "$c" >/dev/null 2>&1 || true
      ctr -a "$sock" -n k8s.io containers delete "$c" >/dev/null 2>&1 || true
    done
  done
}

pki() {
  [[ -s "$D/pki/sa.key" ]] && return 0
  mkdir -p "$D/pki"
  cd "$D/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=skiff-test-ca" -keyout ca.key -out ca.crt 2>/dev/null
  cat >apiserver.ext <<EXT
subjectAltName = IP:$NODE_IP, IP:127.0.0.1, IP:$SVC_API_IP, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local, DNS:localhost
EXT
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile apiserver.ext -out apiserver.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  # Static tokens: the admin (system:masters) and each component under its own Kubernetes identity.
  : >tokens.csv
  for who in "admin,admin,system:masters" "kubelet,system:node:$NODE,system:nodes" "proxy,system:kube-proxy," \
             "cm,system:kube-controller-manager," "sched,system:kube-scheduler,"; do
    IFS=, read -r id user group <<<"$who"
    tok=$(openssl rand -hex 16)
    echo "$tok,$user,$id${group:+,\"$group\"}" >>tokens.csv
    echo "$tok" >"token-$id"
  done
  cd - >/dev/null
}

kubeconfig() {  # ID FILE
  cat >"$2" <<CFG
apiVersion: v1
kind: Config
clusters: [{name: skiff, cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority: "$D/pki/ca.crt"}}]
users: [{name: $1, user: {token: "$(cat "$D/pki/token-$1")"}}]
contexts: [{name: skiff, context: {cluster: skiff, user: $1, namespace: default}}]
current-context: skiff
CFG
}

links() {
  ip link show "$NODE_LINK" >/dev/null 2>&1 || ip link add "$NODE_LINK" type bridge
  ip addr show dev "$NODE_LINK" | grep -q "$NODE_IP/32" || ip addr add "$NODE_IP/32" dev "$NODE_LINK"
  ip link set "$NODE_LINK" up
}

containerd_config() {
  mkdir -p "$D/containerd" "$D/cni/net.d"
  cat >"$D/containerd/config.toml" <<CFG
version = 2
root = "$D/containerd/root"
state = "$D/containerd/state"
[grpc]
  address = "$D/containerd/containerd.sock"
[ttrpc]
  address = "$D/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$D/cni/net.d"
CFG
  cat >"$D/cni/net.d/10-skiff.conflist" <<CFG
{"cniVersion": "0.4.0", "name": "skiff", "plugins": [
  {"type": "bridge", "bridge": "$POD_LINK", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$D/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
CFG
}

import_images() {
  local sock="$D/containerd/containerd.sock" tar name
  for tar in $(bash "$here/images.sh"); do
    name=$(basename "$tar")
    grep -qxF "$name" "$D/imported" 2>/dev/null && continue
    log "importing $name"
    ctr -a "$sock" -n k8s.io images import --no-unpack=false "$tar" >/dev/null
    echo "$name" >>"$D/imported"
  done
}

up() {
  [[ $(id -u) -eq 0 ]] || { echo "cluster.sh: run as root" >&2; exit 1; }
  local t0=$SECONDS
  bash "$here/../install.d/kube.sh" >&2
  mkdir -p "$D/pids" "$D/logs" "$D/etcd" "$D/kubelet" "$D/kubelet-certs" "$D/kubelet-plugins"
  pki
  for id in admin kubelet proxy cm sched; do kubeconfig "$id" "$D/kubeconfig-$id"; done
  cp "$D/kubeconfig-admin" "$K"
  links
  containerd_config
  start etcd "$KUBE_BIN/etcd" --name skiff --data-dir "$D/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "skiff=http://127.0.0.1:$((ETCD_PORT + 1))"
  start containerd containerd --config "$D/containerd/config.toml"
  start apiserver "$KUBE_BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --advertise-address "$NODE_IP" --bind-address "$NODE_IP" --secure-port "$API_PORT" --insecure-port 0 \
    --tls-cert-file "$D/pki/apiserver.crt" --tls-private-key-file "$D/pki/apiserver.key" \
    --client-ca-file "$D/pki/ca.crt" --token-auth-file "$D/pki/tokens.csv" --authorization-mode Node,RBAC \
    --service-account-key-file "$D/pki/sa.pub" --service-account-signing-key-file "$D/pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range "$SVC_CIDR" \
    --kubelet-preferred-address-types InternalIP --allow-privileged=true
  wait_for "the API server" 60 kc get --raw /readyz
  start controller-manager "$KUBE_BIN/kube-controller-manager" --kubeconfig "$D/kubeconfig-cm" \
    --service-account-private-key-file "$D/pki/sa.key" --root-ca-file "$D/pki/ca.crt" \
    --use-service-account-credentials=true --leader-elect=false --port 0 --secure-port 0 \
    --controllers '*,-nodeipam,-csrsigning,-csrapproving,-bootstrapsigner,-tokencleaner'
  start scheduler "$KUBE_BIN/kube-scheduler" --kubeconfig "$D/kubeconfig-sched" --leader-elect=false \
    --port 0 --secure-port 0
  wait_for containerd 30 ctr -a "$D/containerd/containerd.sock" version
  # Containers left by a run that ended without `down` make the kubelet exit at start ("no PodSandbox found
  # with Id ..."): remove them, then restart containerd so its CRI plugin forgets them too.
  if ctr -a "$D/containerd/containerd.sock" -n k8s.io containers ls -q 2>/dev/null | grep -q .; then
    clear_containers
    kill "$(cat "$(pidfile containerd)")"
    local w0=$SECONDS
    while alive containerd && ((SECONDS - w0 < 20)); do sleep 0.5; done
    start containerd containerd --config "$D/containerd/config.toml"
    wait_for containerd 30 ctr -a "$D/containerd/containerd.sock" version
  fi
  import_images
  start kubelet "$KUBE_BIN/kubelet" --kubeconfig "$D/kubeconfig-kubelet" --container-runtime remote \
    --container-runtime-endpoint "unix://$D/containerd/containerd.sock" --runtime-request-timeout 5m \
    --cgroup-driver cgroupfs --fail-swap-on=false --hostname-override "$NODE" --node-ip "$NODE_IP" \
    --address "$NODE_IP" --port 10250 --healthz-port 10248 --read-only-port 0 --root-dir "$D/kubelet" \
    --cert-dir "$D/kubelet-certs" --volume-plugin-dir "$D/kubelet-plugins" --register-node=true \
    --pod-infra-container-image "$PAUSE_IMAGE" --make-iptables-util-chains=false \
    --cluster-dns "$NODE_IP" --cluster-domain cluster.local --image-gc-high-threshold 100 \
    --image-gc-low-threshold 99 --eviction-hard 'memory.available<200Mi,nodefs.available<2%,imagefs.available<2%'
  start proxy "$KUBE_BIN/kube-proxy" --kubeconfig "$D/kubeconfig-proxy" --proxy-mode iptables \
    --hostname-override "$NODE" --bind-address "$NODE_IP" --cluster-cidr "$POD_CIDR" \
    --healthz-bind-address 127.0.0.1:10356 --metrics-bind-address 127.0.0.1:10349 --conntrack-max-per-core 0
  start dns python3 "$here/dns.py" --kubeconfig "$K" --listen "$NODE_IP"
  wait_for "the node" 60 kc get node "$NODE"
  kc patch node "$NODE" --subresource status --type merge \
    -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$FAKE_GPUS\"}}}" >/dev/null
  wait_for "the node to be Ready" 90 kc wait --for condition=Ready "node/$NODE" --timeout 1s
  wait_for "the default ServiceAccount" 60 kc get serviceaccount default
  log "cluster up in $((SECONDS - t0)) s (KUBECONFIG=$K)"
  echo "$K"
}

down() {
  [[ -d "$D/pids" ]] || return 0
  if alive apiserver && alive kubelet; then
    kc delete namespace --wait=false $(kc get ns -o name | grep -v -e /default -e /kube- | sed 's|namespace/||') \
      >/dev/null 2>&1 || true
    kc delete pods --all --all-namespaces --grace-period 0 --force >/dev/null 2>&1 || true
    local t0=$SECONDS
    while ((SECONDS - t0 < 30)) && ctr -a "$D/containerd/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null | grep -q .; do
      sleep 1
    done
  fi
  for name in dns proxy kubelet scheduler controller-manager apiserver; do
    alive "$name" && kill "$(cat "$(pidfile "$name")")"
  done
  sleep 1
  # Sandboxes the kubelet did not get to: stop their tasks, then containerd and etcd.
  alive containerd && clear_containers
  for name in containerd etcd; do
    alive "$name" && kill "$(cat "$(pidfile "$name")")"
  done
  for name in dns proxy kubelet scheduler controller-manager apiserver containerd etcd; do
    local t0=$SECONDS
    while alive "$name" && ((SECONDS - t0 < 20)); do sleep 0.5; done
    alive "$name" && kill -9 "$(cat "$(pidfile "$name")")"
    rm -f "$(pidfile "$name")"
  done
  "$KUBE_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  # What the kubelet and the shim leave: mounts under the state folder, pod logs, kubepods cgroups, links.
  { grep -F " $D/" /proc/mounts || true; } | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf /var/log/pods /var/log/containers "$D/cni/ipam"
  for cg in /sys/fs/cgroup/*/kubepods; do
    [[ -d "$cg" ]] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  for link in "$POD_LINK" "$NODE_LINK"; do ip link del "$link" 2>/dev/null || true; done
  # The CNI plugin's chains (per sandbox) and the kubelet's canary and mark chains, with every rule using them.
  if iptables-save | grep -q -e "CNI-" -e "KUBE-"; then
    iptables-save | grep -v -e "CNI-" -e "KUBE-" | iptables-restore || true
  fi
  log "cluster down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  purge) down; rm -rf "$D" ;;
  env) echo "export KUBECONFIG=$K" ;;
  *) echo "usage: $0 up|down|purge|env" >&2; exit 2 ;;
esac
