#!/usr/bin/env bash
# A Kubernetes cluster on this machine, with remora (or containerd's own CRI) as its node
# runtime: kubeadm init with the control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) as static pods on the runtime, kube-proxy and CoreDNS, the control-plane taint
# removed so that the node runs workloads. docs/kubeadm.md walks through the same steps.
#
#   scripts/cluster.sh up [--runtime remora|containerd]   make the cluster
#   scripts/cluster.sh smoke                              check it as a user would (below)
#   scripts/cluster.sh conformance [--check FILE]         Kubernetes' [Conformance] suite (hours)
#   scripts/cluster.sh down                               kubeadm reset; leave nothing behind
#   scripts/cluster.sh check-clean                        fails if down left anything behind
#   scripts/cluster.sh status                             nodes and pods
#   scripts/cluster.sh kubectl ARGS...                    kubectl on the cluster
#
# The test bed must be up (scripts/testbed.sh up): its registry serves the cluster's images,
# which `up` builds (setup.sh cluster) and pushes under their upstream names, so kubeadm pulls
# them through the runtime as on a real node.
#
# The cluster has its own containerd ($TB_RUN/cluster/containerd.sock; its CRI is the
# `--runtime containerd` node's runtime) and, with `--runtime remora`, its own remora on that
# containerd. Nothing of the test bed's containerd or remora is used.
#
# Network, all on this machine: a bridge $NODE_BRIDGE with $NODE_IP, the node's address (the
# API server advertises it; kubelet's --node-ip); the pod bridge $POD_BRIDGE (CNI bridge +
# host-local) with the node's pod subnet; services in $SERVICE_CIDR through kube-proxy
# (iptables). No masquerading and no route off the machine; CoreDNS answers the cluster's
# names and forwards nothing (its `forward` line is removed).
#
# The host has no systemd: kubeadm writes kubelet's configuration and flags as usual and this
# script runs kubelet with them, as kubeadm's systemd drop-in would. kubelet holds
# /run/remora-kubelet.lock while it runs, so that the kubelet suite and the node e2e suite
# (fixed ports, /var/lib/kubelet) never run beside the cluster.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

K8S_VERSION=v1.37.2 # setup.sh KUBELET_VERSION
CL_ROOT="$TB_ROOT/cluster"
CL_RUN="$TB_RUN/cluster"
LOGS="$CL_ROOT/logs"
CL_CONTAINERD_SOCK="$CL_RUN/containerd.sock"
CL_REMORA_SOCK="$CL_RUN/remora.sock"
CL_CNI_CONF_DIR="$CL_ROOT/cni/net.d"
CL_RUNC_ROOT="$CL_RUN/runc"
CERTS_DIR="$TB_ROOT/certs.d"
NODE_NAME=remora-node-1
NODE_BRIDGE=remora-k8s
NODE_IP=10.217.0.1
NODE_PREFIX=24
POD_BRIDGE=remora-pods
POD_CIDR=10.244.0.0/16
NODE_POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/12
SANDBOX_IMAGE=registry.k8s.io/pause:3.10.2
KUBECONFIG_ADMIN=/etc/kubernetes/admin.conf
KUBELET_LOCK=/run/remora-kubelet.lock
RUNTIME_FILE="$CL_RUN/runtime"
EGRESS_CHAIN=REMORA-CLUSTER-EGRESS

pidfile() { echo "$CL_RUN/$1.pid"; }
kc() { kubectl --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# ---- daemons ----------------------------------------------------------------------------

# start_daemon NAME LOG CMD...: CMD in its own session, no descriptor beyond stdio, its pid in
# $CL_RUN/NAME.pid (as testbed.sh starts its daemons). With LOCK=path set, the daemon holds an
# exclusive flock on that file for its lifetime (inherited fd 9), or does not start.
start_daemon() {
	local name=$1 log=$2 pf
	shift 2
	pf=$(pidfile "$name")
	rm -f "$pf"
	mkdir -p "$(dirname "$log")"
	printf '\n==== %s: starting %s\n' "$(date -u +%FT%TZ)" "$*" >>"$log"
	# shellcheck disable=SC2016 # $$ and $1 belong to the inner shell
	setsid -f bash -c '
		for fd in /proc/$$/fd/*; do
			fd=${fd##*/}
			if [[ $fd -gt 2 ]]; then eval "exec $fd>&-"; fi
		done
		if [[ -n "$LOCK" ]]; then
			exec 9>"$LOCK"
			flock -n 9 || { echo "$LOCK is held: another kubelet runs on this machine" >&2; exit 75; }
		fi
		echo $$ >"$1"; shift; exec "$@"' start-daemon "$pf" "$@" \
		</dev/null >>"$log" 2>&1
	local i
	for ((i = 0; i < 50; i++)); do
		[[ -s "$pf" ]] && return 0
		sleep 0.1
	done
	tail -n 20 "$log" >&2 || true
	die "$name did not start (see $log)"
}

stop_daemon() { # NAME [SECONDS]
	local name=$1 secs=${2:-20} pf pid i
	pf=$(pidfile "$name")
	if ! pid_alive "$pf"; then
		rm -f "$pf"
		return 0
	fi
	pid=$(<"$pf")
	info "stopping $name (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < secs * 10; i++)); do
		proc_running "$pid" || break
		sleep 0.1
	done
	if proc_running "$pid"; then
		warn "$name did not stop after ${secs}s; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		sleep 0.5
	fi
	rm -f "$pf"
}

# wait_until WHAT SECONDS CMD...: polls CMD every second until it succeeds.
wait_until() {
	local what=$1 secs=$2 start=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS - start < secs)) || die "timed out after ${secs}s waiting for $what"
		sleep 1
	done
}

# ---- configuration ---------------------------------------------------------------------

write_containerd_config() {
	mkdir -p "$CL_ROOT/containerd" "$CL_RUN" "$CL_RUNC_ROOT" "$CL_ROOT/opt"
	cat >"$CL_ROOT/containerd.toml" <<EOF
# Generated by scripts/cluster.sh: the cluster node's containerd, apart from the test bed's.
version = 3
root = "$CL_ROOT/containerd"
state = "$CL_RUN/containerd"
imports = []

[grpc]
  address = "$CL_CONTAINERD_SOCK"

[ttrpc]
  address = "$CL_CONTAINERD_SOCK.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$SANDBOX_IMAGE"

  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "$CERTS_DIR"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_unprivileged_icmp = false
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CL_RUNC_ROOT"
        BinaryName = "$PINNED_RUNC"

  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$CL_CNI_CONF_DIR"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.transfer.v1.local"]
  config_path = "$CERTS_DIR"

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.internal.v1.opt"]
  path = "$CL_ROOT/opt"
EOF
}

write_remora_config() {
	mkdir -p "$CL_ROOT/remora" "$CL_RUN/remora"
	cat >"$CL_ROOT/remora.toml" <<EOF
# Generated by scripts/cluster.sh: the cluster node's remora (docs/kubeadm.md).
[server]
socket = "$CL_REMORA_SOCK"
root_dir = "$CL_ROOT/remora"
state_dir = "$CL_RUN/remora"

[containerd]
address = "$CL_CONTAINERD_SOCK"
namespace = "remora"

[images]
sandbox_image = "$SANDBOX_IMAGE"
config_path = "$CERTS_DIR"

[runtime]
cgroup_driver = "cgroupfs"
default_handler = "remora"

[runtime.handlers.runc]
runtime_type = "io.containerd.runc.v2"
binary_name = "$PINNED_RUNC"

[runtime.handlers.remora]
runtime_type = "io.containerd.remora.v2"
binary_name = "$PINNED_RUNC"

[cni]
conf_dir = "$CL_CNI_CONF_DIR"
bin_dirs = ["/usr/lib/cni"]

[nri]
socket_path = "$CL_RUN/remora/nri.sock"
plugin_path = ""
plugin_config_path = ""
EOF
}

write_cni_config() {
	mkdir -p "$CL_CNI_CONF_DIR" "$CL_RUN/cni/networks"
	# The node's pod subnet is the first /24 of the pod CIDR: the one kube-controller-manager
	# allocates to the first node (its node.spec.podCIDR).
	cat >"$CL_CNI_CONF_DIR/10-remora-cluster.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "remora-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$POD_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$CL_RUN/cni/networks",
        "ranges": [[{ "subnet": "$NODE_POD_CIDR" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } },
    { "type": "firewall" }
  ]
}
EOF
}

# The kubeadm configuration: the node's runtime socket as criSocket, the versions and
# addresses above, and kubelet's settings for this host (cgroup v1 without systemd).
write_kubeadm_config() { # SOCKET
	cat >"$CL_ROOT/kubeadm.yaml" <<EOF
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: $NODE_IP
  bindPort: 6443
nodeRegistration:
  name: $NODE_NAME
  criSocket: unix://$1
  imagePullPolicy: IfNotPresent
  kubeletExtraArgs:
  - name: node-ip
    value: $NODE_IP
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: $K8S_VERSION
clusterName: remora
controlPlaneEndpoint: $NODE_IP:6443
networking:
  podSubnet: $POD_CIDR
  serviceSubnet: $SERVICE_CIDR
  dnsDomain: cluster.local
etcd:
  local:
    dataDir: $CL_ROOT/etcd
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
# This host: cgroup v1 (hybrid) and no systemd; docs/kubeadm.md has a systemd + cgroup v2 node's.
# QoS cgroups and allocatable enforcement stay on, as on any kubeadm node (/kubepods).
failCgroupV1: false
failSwapOn: false
# No upstream resolver: nothing of the cluster's DNS leaves the machine.
resolvConf: $CL_ROOT/resolv.conf
serializeImagePulls: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $POD_CIDR
conntrack:
  # Leave the host's nf_conntrack_max as it is.
  maxPerCore: 0
EOF
	printf '# scripts/cluster.sh: no upstream nameserver; CoreDNS answers cluster names only.\n' \
		>"$CL_ROOT/resolv.conf"
}

# ---- host network and kernel settings ----------------------------------------------------

SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)

host_up() {
	modprobe br_netfilter 2>/dev/null || true
	modprobe overlay 2>/dev/null || true
	local s saved="$CL_RUN/sysctls"
	if [[ ! -f "$saved" ]]; then
		for s in "${SYSCTLS[@]}"; do
			echo "$s=$(sysctl -n "$s" 2>/dev/null || echo)"
		done >"$saved"
	fi
	for s in "${SYSCTLS[@]}"; do
		sysctl -qw "$s=1" || die "cannot set $s=1 (kubeadm's preflight needs it)"
	done
	if ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
		ip link add "$NODE_BRIDGE" type bridge
	fi
	ip addr replace "$NODE_IP/$NODE_PREFIX" dev "$NODE_BRIDGE"
	ip link set "$NODE_BRIDGE" up
	# Pods route by default through the pod bridge's gateway, the host: whatever a pod sends to
	# an address off the machine (not a pod, not a node) is refused, never forwarded out of the
	# host's own interfaces.
	iptables -N "$EGRESS_CHAIN" 2>/dev/null || iptables -F "$EGRESS_CHAIN"
	iptables -A "$EGRESS_CHAIN" -d "$POD_CIDR" -j RETURN
	iptables -A "$EGRESS_CHAIN" -d "$NODE_IP/$NODE_PREFIX" -j RETURN
	iptables -A "$EGRESS_CHAIN" -j REJECT
	iptables -C FORWARD -s "$POD_CIDR" -j "$EGRESS_CHAIN" 2>/dev/null ||
		iptables -I FORWARD 1 -s "$POD_CIDR" -j "$EGRESS_CHAIN"
}

host_down() {
	local saved="$CL_RUN/sysctls" line
	while iptables -D FORWARD -s "$POD_CIDR" -j "$EGRESS_CHAIN" 2>/dev/null; do :; done
	iptables -F "$EGRESS_CHAIN" 2>/dev/null || true
	iptables -X "$EGRESS_CHAIN" 2>/dev/null || true
	for dev in "$POD_BRIDGE" "$NODE_BRIDGE"; do
		ip link del "$dev" 2>/dev/null || true
	done
	if [[ -f "$saved" ]]; then
		while IFS= read -r line; do
			if [[ -n "${line#*=}" ]]; then sysctl -qw "$line" 2>/dev/null || true; fi
		done <"$saved"
		rm -f "$saved"
	fi
}

# Every KUBE-* chain of kube-proxy and kubelet, in every table, IPv4 and IPv6.
flush_kube_chains() {
	local ipt table chain rules chains
	for ipt in iptables ip6tables; do
		for table in filter nat mangle raw; do
			rules=$("$ipt-save" -t "$table" 2>/dev/null) || continue
			# The jumps into KUBE-* chains from other chains first, then the chains themselves.
			# xargs splits each rule's words as iptables-save quoted them ("kubernetes service
			# portals"), and expands nothing.
			grep -E '^-A [A-Za-z0-9_-]+ .*-j KUBE-' <<<"$rules" | grep -vE '^-A KUBE-' |
				sed 's/^-A /-D /' | xargs -r -L 1 "$ipt" -t "$table" 2>/dev/null || true
			mapfile -t chains < <(awk '/^:KUBE-/ {print substr($1, 2)}' <<<"$rules")
			for chain in "${chains[@]}"; do
				"$ipt" -t "$table" -F "$chain" 2>/dev/null || true
			done
			for chain in "${chains[@]}"; do
				"$ipt" -t "$table" -X "$chain" 2>/dev/null || true
			done
		done
	done
}

kube_chains() {
	{ iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } | grep -c '^:KUBE-' || true
}

# ---- up -----------------------------------------------------------------------------------

cluster_images() {
	info "building and pushing the cluster's images (log: $LOGS/images.log)"
	run_logged "$LOGS/images.log" python3 "$SCRIPTS_DIR/images/build_push.py" \
		--registry "$REGISTRY_URL" --spec "$SCRIPTS_DIR/images/cluster.json" \
		--cache "$TOOLS/images-cache"
}

crictl_cl() { crictl --runtime-endpoint "unix://$(runtime_sock)" --image-endpoint "unix://$(runtime_sock)" --timeout 10s "$@"; }
runtime_sock() {
	if [[ "$(cat "$RUNTIME_FILE" 2>/dev/null || echo remora)" == containerd ]]; then
		echo "$CL_CONTAINERD_SOCK"
	else
		echo "$CL_REMORA_SOCK"
	fi
}

# kubelet as kubeadm's systemd drop-in (10-kubeadm.conf) runs it: its config file, the
# bootstrap and final kubeconfigs, and the flags kubeadm wrote into kubeadm-flags.env.
start_kubelet() {
	local flags
	flags=$(sed -n 's/^KUBELET_KUBEADM_ARGS="\(.*\)"$/\1/p' /var/lib/kubelet/kubeadm-flags.env)
	info "starting kubelet ($flags)"
	# shellcheck disable=SC2086 # kubeadm's flags are words
	LOCK=$KUBELET_LOCK start_daemon kubelet "$LOGS/kubelet.log" "$TOOLS_BIN/kubelet" \
		--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
		--kubeconfig=/etc/kubernetes/kubelet.conf \
		--config=/var/lib/kubelet/config.yaml $flags
}

cmd_up() {
	local runtime=remora
	while (($#)); do
		case "$1" in
		--runtime)
			runtime=${2:-}
			shift 2
			;;
		*) die "up: unknown argument $1" ;;
		esac
	done
	[[ $runtime == remora || $runtime == containerd ]] || die "--runtime is remora or containerd, not '$runtime'"
	[[ -e /etc/kubernetes/admin.conf ]] && die "a cluster is up (/etc/kubernetes/admin.conf); run \`$0 down\` first"
	curl -fsS -o /dev/null --max-time 2 "$REGISTRY_URL/v2/" ||
		die "the test bed registry does not answer on $REGISTRY_URL: run scripts/testbed.sh up first"
	if [[ -e "$KUBELET_LOCK" ]] && ! flock -n "$KUBELET_LOCK" true; then
		die "$KUBELET_LOCK is held: a kubelet (the kubelet suite, node e2e) runs on this machine"
	fi
	"$SCRIPTS_DIR/setup.sh" cluster
	mkdir -p "$LOGS" "$CL_RUN"
	echo "$runtime" >"$RUNTIME_FILE"
	cluster_images
	host_up
	write_cni_config
	write_containerd_config
	rm -f "$CL_CONTAINERD_SOCK" "$CL_CONTAINERD_SOCK.ttrpc"
	info "starting the node's containerd"
	start_daemon containerd "$LOGS/containerd.log" \
		env PATH="$TOOLS_BIN:$PATH" "$TOOLS_BIN/containerd" --config "$CL_ROOT/containerd.toml"
	wait_until "the node's containerd" 60 ctr --address "$CL_CONTAINERD_SOCK" version
	local sock=$CL_CONTAINERD_SOCK
	if [[ $runtime == remora ]]; then
		local bin="${REMORA_BIN:-$REPO_ROOT/target/debug/remora}"
		if [[ -z "${REMORA_BIN:-}" ]]; then
			info "cargo build --locked --bin remora (log: $LOGS/remora-build.log)"
			(cd "$REPO_ROOT" && run_logged "$LOGS/remora-build.log" cargo build --locked --bin remora)
		fi
		[[ -x "$bin" ]] || die "remora binary $bin is missing"
		write_remora_config
		rm -f "$CL_REMORA_SOCK"
		info "starting the node's remora ($bin)"
		start_daemon remora "$LOGS/remora.log" "$(realpath "$bin")" --config "$CL_ROOT/remora.toml"
		wait_until "the node's remora" 60 crictl --runtime-endpoint "unix://$CL_REMORA_SOCK" --timeout 2s version
		sock=$CL_REMORA_SOCK
	fi
	write_kubeadm_config "$sock"
	# kubeadm init: its preflight pulls the control plane's images through the runtime. The
	# checks this host cannot pass are named: no systemd (kubelet is started here, below),
	# cgroup v1 (SystemVerification) and swap. kubeadm cannot start kubelet without systemd; it
	# warns and waits for kubelet's health, which start_kubelet brings once kubeadm has written
	# kubelet's files.
	rm -rf /var/lib/kubelet/config.yaml /var/lib/kubelet/kubeadm-flags.env
	info "kubeadm init (log: $LOGS/kubeadm-init.log)"
	local started=$SECONDS
	kubeadm init --config "$CL_ROOT/kubeadm.yaml" \
		--ignore-preflight-errors=SystemVerification,Swap,Service-Kubelet \
		>"$LOGS/kubeadm-init.log" 2>&1 &
	local kubeadm_pid=$!
	while [[ ! -s /var/lib/kubelet/kubeadm-flags.env || ! -s /var/lib/kubelet/config.yaml ]]; do
		if ! kill -0 "$kubeadm_pid" 2>/dev/null; then
			tail -n 40 "$LOGS/kubeadm-init.log" >&2
			die "kubeadm init ended before writing kubelet's configuration (log: $LOGS/kubeadm-init.log)"
		fi
		((SECONDS - started < 600)) || die "kubeadm init wrote no kubelet configuration in 10 min"
		sleep 1
	done
	start_kubelet
	if ! wait "$kubeadm_pid"; then
		tail -n 60 "$LOGS/kubeadm-init.log" >&2
		tail -n 40 "$LOGS/kubelet.log" >&2
		die "kubeadm init failed (log: $LOGS/kubeadm-init.log; kubelet's: $LOGS/kubelet.log)"
	fi
	info "kubeadm init done in $((SECONDS - started))s"
	# Workloads on the control-plane node (one node).
	kc taint nodes --all node-role.kubernetes.io/control-plane- >/dev/null
	# CoreDNS: cluster names only, nothing forwarded off the machine (and no `loop` check, which
	# needs an upstream to probe).
	local corefile
	corefile=$(kc -n kube-system get configmap coredns -o jsonpath='{.data.Corefile}' | awk '
		skip { if ($0 ~ /^[[:space:]]*}[[:space:]]*$/) skip = 0; next }
		/^[[:space:]]*forward[[:space:]]/ { if ($0 ~ /[{][[:space:]]*$/) skip = 1; next }
		/^[[:space:]]*loop[[:space:]]*$/ { next }
		{ print }')
	grep -qE '^\s*(forward|loop)\b' <<<"$corefile" && die "CoreDNS' Corefile still forwards: $corefile"
	kc -n kube-system create configmap coredns --from-literal=Corefile="$corefile" --dry-run=client -o yaml |
		kc replace -f - >/dev/null
	kc -n kube-system rollout restart deployment coredns >/dev/null
	wait_until "node $NODE_NAME Ready" 180 node_ready
	wait_until "kube-proxy to run" 180 kc -n kube-system rollout status daemonset kube-proxy --timeout=5s
	wait_until "CoreDNS to run" 240 kc -n kube-system rollout status deployment coredns --timeout=5s
	info "cluster up on $runtime in $((SECONDS - started))s: kubectl --kubeconfig $KUBECONFIG_ADMIN"
}

node_ready() {
	[[ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

# ---- down ---------------------------------------------------------------------------------

cmd_down() {
	local runtime sock
	runtime=$(cat "$RUNTIME_FILE" 2>/dev/null || echo remora)
	sock=$(runtime_sock)
	if [[ -e /etc/kubernetes/admin.conf || -e /var/lib/kubelet/kubeadm-flags.env ]]; then
		info "kubeadm reset"
		# reset stops every pod through the runtime and removes /etc/kubernetes, kubelet's files and
		# etcd's data; kubelet must be gone first, or it restarts the static pods.
		stop_daemon kubelet 30
		if [[ -S "$sock" ]]; then
			kubeadm reset -f --cri-socket "unix://$sock" >>"$LOGS/kubeadm-reset.log" 2>&1 ||
				warn "kubeadm reset failed (log: $LOGS/kubeadm-reset.log)"
		else
			kubeadm reset -f >>"$LOGS/kubeadm-reset.log" 2>&1 || true
		fi
	fi
	stop_daemon kubelet 30
	if [[ -S "$sock" ]]; then
		# Whatever reset left: pods first (their containers with them).
		crictl_cl rmp -af >/dev/null 2>&1 || true
	fi
	stop_daemon remora 30
	stop_daemon containerd 30
	# kube-proxy's and kubelet's chains; the pod network's bridge and the node's.
	flush_kube_chains
	host_down
	# Mounts left under kubelet's and the node's directories (a killed run).
	local m
	awk '$5 ~ "^(/var/lib/kubelet(/|$)|'"$CL_RUN"'/|'"$CL_ROOT"'/)" {print $5}' /proc/self/mountinfo | sort -r |
		while read -r m; do
			umount -l "$m" 2>/dev/null || true
		done
	rm -rf /var/lib/kubelet /etc/kubernetes "$CL_ROOT/etcd" "$CL_RUN"
	rm -rf "$CL_ROOT/containerd" "$CL_ROOT/remora" "$CL_ROOT/cni"
	# $CL_ROOT/logs stays for a look afterwards.
	info "cluster down"
}

# What a teardown must leave: no pods' mounts, network namespaces or KUBE-* chains.
cmd_check_clean() {
	local bad=0 n
	n=$(kube_chains)
	if ((n > 0)); then
		warn "$n KUBE-* chains left"
		bad=1
	fi
	if awk '$5 ~ "^(/var/lib/kubelet(/|$)|'"$CL_RUN"'/|'"$CL_ROOT"'/)"' /proc/self/mountinfo | grep -q .; then
		warn "mounts left: $(awk '$5 ~ "^(/var/lib/kubelet(/|$)|'"$CL_RUN"'/|'"$CL_ROOT"'/)" {print $5}' /proc/self/mountinfo | tr '\n' ' ')"
		bad=1
	fi
	if ip link show "$POD_BRIDGE" >/dev/null 2>&1 || ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
		warn "the cluster's bridges are left"
		bad=1
	fi
	for n in kubelet remora containerd; do
		if pid_alive "$(pidfile "$n")"; then
			warn "$n still runs"
			bad=1
		fi
	done
	if pgrep -f "containerd-shim.* -address $CL_CONTAINERD_SOCK" >/dev/null; then
		warn "shims of the node's containerd left: $(pgrep -f "containerd-shim.* -address $CL_CONTAINERD_SOCK" | tr '\n' ' ')"
		bad=1
	fi
	if pgrep -f "kube-apiserver|etcd --advertise|kube-proxy|coredns -conf" >/dev/null; then
		warn "cluster processes left: $(pgrep -af 'kube-apiserver|etcd --advertise|kube-proxy|coredns -conf' | cut -c1-80 | tr '\n' ';')"
		bad=1
	fi
	((bad == 0)) || die "the teardown left the above behind"
	info "nothing left behind"
}

# ---- conformance --------------------------------------------------------------------------

# Kubernetes' conformance suite (test/e2e, focus [Conformance]) against the cluster, as
# hydrophone and sonobuoy run it: the parallel part first, then the [Serial] part alone.
# Reports under $CL_ROOT/conformance-<runtime>/; --check FILE holds the run to a ratchet (every
# test FILE names must pass). The whole run takes hours on 2 cores: a script, not a CI phase.
cmd_conformance() {
	local check="" procs=2 focus='\[Conformance\]' skip='' part parts=(parallel serial)
	while (($#)); do
		case "$1" in
		--check)
			check=${2:?--check needs a file}
			shift 2
			;;
		--procs)
			procs=${2:?}
			shift 2
			;;
		--focus)
			focus=${2:?}
			shift 2
			;;
		--skip)
			skip=${2:?}
			shift 2
			;;
		--only)
			parts=("${2:?--only parallel|serial}")
			shift 2
			;;
		*) die "conformance: unknown argument $1" ;;
		esac
	done
	[[ -e "$KUBECONFIG_ADMIN" ]] || die "no cluster: run $0 up first"
	"$SCRIPTS_DIR/setup.sh" cluster-e2e
	local runtime out results
	runtime=$(cat "$RUNTIME_FILE" 2>/dev/null || echo remora)
	out="$CL_ROOT/conformance-$runtime"
	rm -rf "$out"
	mkdir -p "$out"
	results="$out/results.txt"
	: >"$results"
	for part in "${parts[@]}"; do
		# [Serial] is a ginkgo label of the suite (with its text in the spec's name): the parts
		# are split by label, as hydrophone splits them by name.
		local p=$procs labels='!Serial && !Disruptive && !Flaky'
		if [[ $part == serial ]]; then
			p=1
			labels='Serial && !Disruptive && !Flaky'
		fi
		info "conformance ($runtime, $part part, $p process(es)); log: $out/$part.log"
		local started=$SECONDS rc=0
		(
			cd "$out"
			timeout --kill-after=60s 5h "$TOOLS_BIN/ginkgo" --procs="$p" --no-color --timeout=5h \
				--focus="$focus" ${skip:+--skip="$skip"} --label-filter="$labels" \
				--json-report="$out/$part.json" \
				"$TOOLS_BIN/e2e.test" -- \
				--kubeconfig="$KUBECONFIG_ADMIN" --provider=skeleton \
				--report-dir="$out" --e2e-output-dir="$out"
		) </dev/null >"$out/$part.log" 2>&1 || rc=$?
		info "$part part: exit $rc after $(((SECONDS - started) / 60)) min"
		[[ -s "$out/$part.json" ]] || die "the $part part produced no report (exit $rc); see $out/$part.log"
		ginkgo_results "$out/$part.json" | grep -v '^SKIP ' >>"$results" || true
		echo "$part $((SECONDS - started))" >>"$out/times.txt"
	done
	LC_ALL=C sort -o "$results" "$results"
	local passed failed
	passed=$(grep -c '^PASS ' "$results" || true)
	failed=$(grep -c '^FAIL ' "$results" || true)
	grep '^FAIL ' "$results" >&2 || true
	echo "conformance ($runtime): $passed passed, $failed failed"
	((passed + failed > 0)) || die "the suite ran no test (see $out/*.log)"
	if [[ -n "$check" ]]; then
		check_ratchet "$results" "$check" test
	fi
}

# ---- main ---------------------------------------------------------------------------------

cmd=${1:-}
[[ -n "$cmd" ]] && shift
case "$cmd" in
up) cmd_up "$@" ;;
down) cmd_down ;;
check-clean) cmd_check_clean ;;
smoke) "$SCRIPTS_DIR/cluster-smoke.sh" "$@" ;;
conformance) cmd_conformance "$@" ;;
status)
	kc get nodes -o wide
	kc get pods -A -o wide
	;;
kubectl) kc "$@" ;;
*) die "usage: cluster.sh up [--runtime remora|containerd] | smoke | conformance [--check FILE] | down | check-clean | status | kubectl ARGS..." ;;
esac
