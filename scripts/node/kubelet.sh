#!/usr/bin/env bash
# Runs in the node VM (scripts/node-test.sh pipes it to `node-vm.sh ssh -- bash -s`): kubelet
# installed and configured as kubeadm would (systemd cgroup driver, QoS cgroups, static pods,
# its own systemd unit ordered after remora.service), standalone (no API server), its pods read
# from kubelet's own API (/pods on 127.0.0.1:10250) and checked there and with crictl:
#   a. an emptyDir shared by nginx and busybox, HTTP readiness, TCP and exec liveness, exec
#      readiness: Ready, no restart over several probe periods, containers in remora-<id>.scope
#      under the pod's slice in kubepods.slice;
#   b. AppArmor: RuntimeDefault is remora-default (enforce); a Localhost profile denies a write;
#   c. an OOM kill under cgroup v2 and systemd: kubelet reports OOMKilled, exit code 137;
#   d. a `hostUsers: false` pod on this kernel (6.1, no idmapped tmpfs): remora says its
#      handler has no user namespaces, kubelet refuses the pod itself and nothing is created;
#   e. remora restarted by systemd: kubelet carries on, nothing restarts, pods stay Ready;
# then every manifest removed: kubelet removes the pods and is stopped.
# Every failure names the step and prints kubelet's and remora's warnings since the start.
set -euo pipefail
say() { printf 'node: %s\n' "$*" >&2; }
since=$(date '+%Y-%m-%d %H:%M:%S')
fail() {
	say "FAILED: $*"
	say "kubelet's log (warnings and errors) since $since:"
	journalctl -u kubelet --since "$since" --no-pager -o cat | grep -E '^[EW][0-9]{4} ' | tail -n 60 >&2 || true
	say "remora's log (warnings and errors) since $since:"
	journalctl -u remora --since "$since" --no-pager -o cat | grep -E ' (WARN|ERRO|CRIT) ' | tail -n 60 >&2 || true
	exit 1
}
# wait_for SECONDS DESCRIPTION CMD...: CMD until it succeeds, at most SECONDS.
wait_for() {
	local limit=$1 what=$2 end=$((SECONDS + $1))
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS < end)) || fail "$what: not within $limit s"
		sleep 1
	done
}

MANIFESTS=/etc/kubernetes/manifests
BUSYBOX=registry.k8s.io/e2e-test-images/busybox:1.36.1-1
NGINX=registry.k8s.io/e2e-test-images/nginx:1.14-2
DENY_PROFILE=k8s-node-test-deny-write
# The probes' period: "a couple of periods" below is a multiple of it. An exec probe takes a
# second or two on a TCG guest under load (kubelet's default timeout is 1 s: timed-out exec
# liveness probes then restart healthy containers), so every probe gets a generous timeout.
PERIOD=3
PROBE_TIMEOUT=20

# ---- kubelet as kubeadm installs it ---------------------------------------------------------
install -m 0755 /mnt/tools/bin/kubelet /usr/local/bin/kubelet
# kubeadm's kubelet.service (kubernetes/release, cmd/krel/templates/.../kubelet.service) and
# its 10-kubeadm.conf drop-in, less the kubeconfig flags: no API server here. Ordered after
# remora, which is started only once it serves.
cat >/etc/systemd/system/kubelet.service <<'EOF'
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target remora.service

[Service]
ExecStart=/usr/local/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
install -d /etc/systemd/system/kubelet.service.d
cat >/etc/systemd/system/kubelet.service.d/10-kubeadm.conf <<'EOF'
[Service]
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
ExecStart=
ExecStart=/usr/local/bin/kubelet $KUBELET_CONFIG_ARGS
EOF
install -d /var/lib/kubelet "$MANIFESTS"
rm -f "$MANIFESTS"/*
# kubeadm's defaults where they matter (cgroupDriver systemd, QoS cgroups, allocatable
# enforcement on pods, static pod path, healthz on 127.0.0.1:10248), the runtime's socket,
# and what a standalone kubelet read over loopback needs: anonymous read access to its API on
# 127.0.0.1 (never on a real node), no swap check, a quick manifest rescan, and eviction and
# image GC thresholds a small VM disk never reaches.
cat >/var/lib/kubelet/config.yaml <<'EOF'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/remora/remora.sock
imageServiceEndpoint: unix:///run/remora/remora.sock
cgroupDriver: systemd
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
staticPodPath: /etc/kubernetes/manifests
fileCheckFrequency: 1s
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
EOF
grep -q '^cgroup_driver = "systemd"' /etc/remora/config.toml ||
	fail "remora's cgroup_driver is not \"systemd\", kubelet's is (node-install.sh sets it)"
# kubelet sets these on start (docs/kubelet.md): recorded, put back once it is stopped, so
# that the phases after this one meet the node as it was.
declare -A sysctls
for k in vm/overcommit_memory kernel/panic kernel/panic_on_oops; do sysctls[$k]=$(<"/proc/sys/$k"); done
systemctl daemon-reload
systemctl start kubelet || fail "systemctl start kubelet"
# The node has no curl (a minimal Debian): HTTP through bash's /dev/tcp, HTTPS through
# openssl s_client (ca-certificates brings openssl). HTTP/1.0: the server closes after its
# answer, never chunked.
healthy() {
	timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/10248 &&
		printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && tail -n 1 <&3' | grep -qx ok
}
wait_for 120 "kubelet's /healthz to answer ok" healthy
# pods_api: kubelet's /pods (its self-signed certificate is not checked), the body only.
pods_api() {
	local resp
	resp=$(printf 'GET /pods HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' |
		timeout 10 openssl s_client -quiet -connect 127.0.0.1:10250 2>/dev/null) || true
	[[ $resp == HTTP/1.?" 200 "* ]] || return 1
	printf '%s\n' "${resp#*$'\r\n\r\n'}"
}
wait_for 30 "kubelet's /pods to answer" pods_api
say "ok: kubelet $(/usr/local/bin/kubelet --version | cut -d' ' -f2) running under systemd (healthz ok, /pods answers)"

# ---- helpers over kubelet's /pods ------------------------------------------------------------
# pod NAME: the static pod's JSON from kubelet's /pods (its name is NAME-<node>), or nothing.
pod() {
	pods_api | jq -c --arg n "$1-" '.items[]? | select(.metadata.name | startswith($n))'
}
# cstatus POD CONTAINER: the container's status in the pod's JSON on stdin.
cstatus() {
	pod "$1" | jq -c --arg c "$2" '.status.containerStatuses[]? | select(.name == $c)'
}
# cid POD CONTAINER: the container's CRI ID.
cid() {
	local id
	id=$(cstatus "$1" "$2" | jq -r '.containerID // empty')
	[[ -n $id ]] || return 1
	echo "${id#*://}"
}
# ready POD: the pod is Running and every container ready.
ready() {
	pod "$1" | jq -e '.status.phase == "Running" and
		(.status.containerStatuses | length > 0 and all(.ready))' >/dev/null
}
# restarts POD: "name=restartCount" of each container, sorted.
restarts() {
	pod "$1" | jq -r '[.status.containerStatuses[] | "\(.name)=\(.restartCount)"] | sort | join(" ")'
}
# cpid CONTAINER_ID: the container's init pid on the node.
cpid() { crictl inspect -o go-template --template '{{.info.pid}}' "$1"; }
# write_manifest NAME: stdin becomes manifest NAME.yaml, put in place atomically.
write_manifest() {
	cat >"/root/$1.yaml.tmp"
	mv "/root/$1.yaml.tmp" "$MANIFESTS/$1.yaml"
}
# describe POD: what kubelet says of a pod, for a failure.
describe() {
	pod "$1" | jq -c '{phase: .status.phase, conditions: [.status.conditions[]? | {type, status, reason}],
		containers: [.status.containerStatuses[]? | {name, ready, restartCount, state, lastState}]}'
}
# wait_ready SECONDS POD
wait_ready() {
	local end=$((SECONDS + $1))
	until ready "$2"; do
		((SECONDS < end)) || fail "pod $2 is not Ready within $1 s: $(describe "$2")"
		sleep 1
	done
}

# ---- the static pods ---------------------------------------------------------------------------
write_manifest web <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  volumes:
  - name: shared
    emptyDir: {}
  containers:
  - name: nginx
    image: $NGINX
    volumeMounts:
    - { name: shared, mountPath: /usr/share/nginx/html }
    readinessProbe:
      httpGet: { path: /shared.html, port: 80 }
      periodSeconds: $PERIOD
      timeoutSeconds: $PROBE_TIMEOUT
    livenessProbe:
      tcpSocket: { port: 80 }
      periodSeconds: $PERIOD
      timeoutSeconds: $PROBE_TIMEOUT
  - name: writer
    image: $BUSYBOX
    command: [sh, -c, 'echo written-by-writer >/shared/shared.html && exec sleep 3600']
    volumeMounts:
    - { name: shared, mountPath: /shared }
    readinessProbe:
      exec: { command: [test, -s, /shared/shared.html] }
      periodSeconds: $PERIOD
      timeoutSeconds: $PROBE_TIMEOUT
    livenessProbe:
      exec: { command: [cat, /shared/shared.html] }
      periodSeconds: $PERIOD
      timeoutSeconds: $PROBE_TIMEOUT
EOF
write_manifest aa-default <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: aa-default
spec:
  securityContext:
    appArmorProfile: { type: RuntimeDefault }
  containers:
  - name: main
    image: $BUSYBOX
    command: [sleep, '3600']
EOF
# A profile of our own, loaded as an operator would before the pod that names it.
cat >/etc/apparmor.d/$DENY_PROFILE <<EOF
#include <tunables/global>
profile $DENY_PROFILE flags=(attach_disconnected,mediate_deleted) {
  #include <abstractions/base>
  file,
  network,
  capability,
  signal,
  # The check's write: denied under /tmp, allowed anywhere else.
  deny /tmp/** w,
}
EOF
out=$(apparmor_parser -r "/etc/apparmor.d/$DENY_PROFILE" 2>&1) || fail "apparmor_parser $DENY_PROFILE: $out"
write_manifest aa-deny <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: aa-deny
spec:
  containers:
  - name: main
    image: $BUSYBOX
    command: [sleep, '3600']
    securityContext:
      appArmorProfile: { type: Localhost, localhostProfile: $DENY_PROFILE }
EOF
# ---- a. emptyDir, probes, kubepods.slice -------------------------------------------------------
# The first pod pulls the images through remora (from the test bed's registry): TCG is slow.
wait_ready 300 web
web_nginx=$(cid web nginx) || fail "no container ID for web/nginx"
web_writer=$(cid web writer) || fail "no container ID for web/writer"
page=$(crictl exec "$web_nginx" cat /usr/share/nginx/html/shared.html 2>&1) || fail "exec in web/nginx: $page"
[[ $page == written-by-writer ]] || fail "nginx sees '$page' in the emptyDir, not the writer's file"
# Ready and no restart over three probe periods of each probe.
end=$((SECONDS + 4 * PERIOD))
while ((SECONDS < end)); do
	ready web || fail "web is no longer Ready: $(describe web)"
	r=$(restarts web)
	[[ $r == "nginx=0 writer=0" ]] || fail "web's containers restarted ($r): $(describe web)"
	sleep 1
done
uid=$(pod web | jq -r .metadata.uid)
qos=$(pod web | jq -r '.status.qosClass | ascii_downcase')
slice=kubepods-$qos-pod${uid//-/_}.slice
for c in "$web_nginx" "$web_writer"; do
	pid=$(cpid "$c") || fail "crictl inspect $c"
	cg=$(cut -d: -f3 "/proc/$pid/cgroup") || fail "container $c: no cgroup for its pid '$pid'"
	want=/kubepods.slice/kubepods-$qos.slice/$slice/remora-$c.scope
	[[ $cg == "$want" ]] || fail "container $c's cgroup is $cg, not $want"
done
say "ok: a. web Ready (HTTP and exec readiness, TCP and exec liveness), no restart over $((4 * PERIOD)) s; nginx serves the writer's emptyDir file; containers in /kubepods.slice/kubepods-$qos.slice/$slice/remora-<id>.scope"

# ---- b. AppArmor ---------------------------------------------------------------------------------
wait_ready 120 aa-default
c=$(cid aa-default main) || fail "no container ID for aa-default/main"
pid=$(cpid "$c") || fail "crictl inspect $c"
label=$(cat "/proc/$pid/attr/current") || fail "aa-default: no AppArmor label for pid '$pid'"
[[ $label == "remora-default (enforce)" ]] || fail "aa-default's container runs under '$label', not remora-default (enforce)"
say "ok: b. appArmorProfile RuntimeDefault: $label"
wait_ready 120 aa-deny
c=$(cid aa-deny main) || fail "no container ID for aa-deny/main"
pid=$(cpid "$c") || fail "crictl inspect $c"
label=$(cat "/proc/$pid/attr/current") || fail "aa-deny: no AppArmor label for pid '$pid'"
[[ $label == "$DENY_PROFILE (enforce)" ]] || fail "aa-deny's container runs under '$label', not $DENY_PROFILE (enforce)"
out=$(crictl exec "$c" touch /etc/allowed 2>&1) || fail "aa-deny: a write outside /tmp failed too: $out"
if out=$(crictl exec "$c" touch /tmp/denied 2>&1); then
	fail "aa-deny: writing /tmp/denied succeeded under $DENY_PROFILE"
fi
[[ $out == *"Permission denied"* ]] || fail "aa-deny: the write failed, but not with EACCES: $out"
say "ok: b. appArmorProfile Localhost $DENY_PROFILE: $label; /etc/allowed written, /tmp/denied refused (${out%%$'\n'*})"

# ---- c. an OOM kill ------------------------------------------------------------------------------
write_manifest oom <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: oom
spec:
  restartPolicy: Never
  containers:
  - name: hog
    image: $BUSYBOX
    command: [dd, if=/dev/zero, of=/dev/null, bs=64M, count=4]
    resources:
      limits: { memory: 32Mi }
EOF
terminated() { cstatus oom hog | jq -e '.state.terminated' >/dev/null; }
wait_for 180 "oom/hog to terminate" terminated
got=$(cstatus oom hog | jq -r '.state.terminated | "\(.reason) \(.exitCode)"')
[[ $got == "OOMKilled 137" ]] || fail "oom/hog terminated with '$got', not 'OOMKilled 137': $(describe oom)"
say "ok: c. a 32 MiB container that allocates 64 MiB: kubelet reports $got"
rm -f "$MANIFESTS/oom.yaml"

# ---- d. hostUsers: false on a kernel without idmapped tmpfs ------------------------------------------
features=$(crictl info -o json | jq -c '[.runtimeHandlers[]? | {name: (.name // ""), userns: (.features.user_namespaces // false)}]')
jq -e 'length > 0 and all(.userns == false)' <<<"$features" >/dev/null ||
	fail "remora claims user namespaces on kernel $(uname -r), which has no idmapped tmpfs: $features"
write_manifest userns <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: userns
spec:
  hostUsers: false
  containers:
  - name: main
    image: $BUSYBOX
    command: [sleep, '3600']
EOF
refused() {
	journalctl -u kubelet --since "$since" --no-pager -o cat |
		grep -q 'hostUsers: false`, runtime does not support user namespaces'
}
wait_for 120 "kubelet to refuse the hostUsers: false pod" refused
[[ -z $(crictl pods -q --name userns) ]] || fail "a sandbox was made for the refused pod: $(crictl pods --name userns)"
say "ok: d. hostUsers: false on $(uname -r): handlers $features; kubelet refuses the pod (runtime does not support user namespaces), nothing made"
rm -f "$MANIFESTS/userns.yaml"

# ---- e. remora restarted under kubelet ------------------------------------------------------------------
running_pods=(web aa-default aa-deny)
declare -A before_ids before_restarts
for p in "${running_pods[@]}"; do
	before_restarts[$p]=$(restarts "$p")
	before_ids[$p]=$(pod "$p" | jq -r '[.status.containerStatuses[].containerID] | sort | join(" ")')
done
before=$(systemctl show -p MainPID --value remora)
systemctl restart remora || fail "systemctl restart remora"
after=$(systemctl show -p MainPID --value remora)
[[ $after != "$before" && $after != 0 ]] || fail "remora's main pid $before -> $after"
# kubelet notices the runtime back (its PLEG relists every second), probes on; watch it for
# several probe periods: same containers, no restart, still Ready.
end=$((SECONDS + 5 * PERIOD + 5))
while ((SECONDS < end)); do
	for p in "${running_pods[@]}"; do
		ready "$p" || fail "after remora's restart pod $p is not Ready: $(describe "$p")"
		r=$(restarts "$p")
		[[ $r == "${before_restarts[$p]}" ]] || fail "after remora's restart pod $p's restart counts went ${before_restarts[$p]} -> $r"
		ids=$(pod "$p" | jq -r '[.status.containerStatuses[].containerID] | sort | join(" ")')
		[[ $ids == "${before_ids[$p]}" ]] || fail "after remora's restart pod $p's containers changed: ${before_ids[$p]} -> $ids"
	done
	sleep 1
done
# crictl, through the restarted remora, lists the same running containers as kubelet.
want=$(for p in "${running_pods[@]}"; do echo "${before_ids[$p]}"; done | tr ' ' '\n' | sed 's|^.*://||' | sort | tr '\n' ' ')
have=$(crictl ps -q --no-trunc | sort | tr '\n' ' ')
[[ $have == "$want" ]] || fail "after remora's restart crictl lists running containers '$have', kubelet's are '$want'"
say "ok: e. remora restarted (pid $before -> $after): ${running_pods[*]} still Ready, same containers, no restart; crictl lists the same $(wc -w <<<"$have") running containers"

# ---- the end: manifests removed, kubelet removes its pods, kubelet stopped ---------------------------------
rm -f "$MANIFESTS"/*.yaml
gone() { [[ $(pods_api | jq '.items | length') == 0 ]]; }
wait_for 120 "kubelet to drop the removed pods from /pods" gone
# kubelet's garbage collection (every minute) removes the stopped sandboxes.
end=$((SECONDS + 180))
until [[ -z $(crictl pods -q) ]]; do
	((SECONDS < end)) || fail "kubelet did not remove the pods' sandboxes within 180 s: $(crictl pods)"
	sleep 1
done
systemctl stop kubelet || fail "systemctl stop kubelet"
for k in "${!sysctls[@]}"; do echo "${sysctls[$k]}" >"/proc/sys/$k"; done
[[ -z $(crictl ps -a -q) ]] || fail "containers left after kubelet removed its pods: $(crictl ps -a)"
say "kubelet checks passed"
