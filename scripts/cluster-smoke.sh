#!/usr/bin/env bash
# The cluster smoke pass (`scripts/cluster.sh smoke`), on a cluster `cluster.sh up` made: what a
# user does first with a new node, each step through the API server and kubelet to the runtime.
#   1. a Deployment of 3 replicas rolls out, then rolls to another image;
#   2. a Service reaches the replicas through kube-proxy, and a pod resolves its name through
#      cluster DNS;
#   3. kubectl exec, logs -f, attach, port-forward and cp;
#   4. a Job completes and a DaemonSet runs;
#   5. kubectl drain evicts the node's pods (then uncordon).
# Every wait has a deadline; a failure prints what kubectl says about the objects involved.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

KUBECONFIG_ADMIN=/etc/kubernetes/admin.conf
NS=remora-smoke
WEB_IMAGE_1=registry.k8s.io/e2e-test-images/nginx:1.27.0-2
WEB_IMAGE_2=registry.k8s.io/e2e-test-images/httpd:2.4.39-4
# busybox on glibc: its wget resolves names through glibc (the static busybox of 1.37.0-2 crashes
# in static glibc's NSS when it looks a name up).
TOOLBOX_IMAGE=registry.k8s.io/e2e-test-images/busybox:1.29-2
TMP=$(mktemp -d)
PF_PID=""

kc() { kubectl --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
step() { info "[$((SECONDS / 60))m$(printf %02d $((SECONDS % 60)))s] $*"; }

cleanup() {
	local rc=$?
	if [[ -n "$PF_PID" ]]; then kill "$PF_PID" 2>/dev/null || true; fi
	if ((rc != 0)); then
		warn "smoke failed (exit $rc); the namespace's state:"
		kc -n "$NS" get all,events -o wide >&2 2>&1 || true
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT

[[ -e "$KUBECONFIG_ADMIN" ]] || die "no cluster: run scripts/cluster.sh up first"
node=$(kc get nodes -o jsonpath='{.items[0].metadata.name}')
[[ -n "$node" ]] || die "the cluster has no node"

kc delete namespace "$NS" --ignore-not-found --wait=true --timeout=120s >/dev/null
kc create namespace "$NS" >/dev/null
# The namespace's default service account is made by the controller manager; pods wait for it.
for ((i = 0; i < 60; i++)); do
	kc -n "$NS" get serviceaccount default >/dev/null 2>&1 && break
	sleep 1
done

# ---- 1. a Deployment rolls out, then to another image ---------------------------------------
step "Deployment web: 3 replicas of $WEB_IMAGE_1"
kc -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  strategy: {rollingUpdate: {maxUnavailable: 1, maxSurge: 1}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: web
        image: $WEB_IMAGE_1
        ports: [{containerPort: 80}]
        readinessProbe:
          httpGet: {path: /, port: 80}
          periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 80}]
EOF
kc -n "$NS" rollout status deployment/web --timeout=180s >/dev/null
step "rolling web to $WEB_IMAGE_2"
kc -n "$NS" set image deployment/web "web=$WEB_IMAGE_2" >/dev/null
kc -n "$NS" rollout status deployment/web --timeout=180s >/dev/null
# Pods of the old ReplicaSet may still be terminating: only running ones of the new image count.
images=$(kc -n "$NS" get pods -l app=web -o jsonpath='{range .items[*]}{.status.phase}/{.spec.containers[0].image}{"\n"}{end}')
running=$(grep -c "^Running/$WEB_IMAGE_2\$" <<<"$images" || true)
((running == 3)) || die "after the rollout, want 3 running pods of $WEB_IMAGE_2, got: $images"

# ---- 2. the Service through kube-proxy, its name through cluster DNS ------------------------
step "toolbox pod; the Service by name (cluster DNS) and by ClusterIP (kube-proxy)"
kc -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: toolbox}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: toolbox
    image: $TOOLBOX_IMAGE
    command: [sh, -c, 'i=0; while true; do i=\$((i+1)); echo "line \$i"; sleep 1; done']
---
apiVersion: v1
kind: Pod
metadata: {name: echo}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: $TOOLBOX_IMAGE
    stdin: true
    command: [sh, -c, 'while read -r l; do echo "got:\$l"; done']
EOF
kc -n "$NS" wait --for=condition=Ready pod/toolbox pod/echo --timeout=120s >/dev/null
cluster_ip=$(kc -n "$NS" get service web -o jsonpath='{.spec.clusterIP}')
# The name resolves to the Service's ClusterIP through CoreDNS (the pod's resolv.conf names
# kube-dns' ClusterIP, itself reached through kube-proxy).
resolved=""
for ((i = 0; i < 30; i++)); do
	resolved=$(kc -n "$NS" exec toolbox -- nslookup "web.$NS.svc.cluster.local" 2>/dev/null |
		awk '/^Address/ {print $NF}' | grep -Fx "$cluster_ip" || true)
	[[ -n "$resolved" ]] && break
	sleep 1
done
[[ "$resolved" == "$cluster_ip" ]] || die "web.$NS.svc.cluster.local did not resolve to $cluster_ip: $(kc -n "$NS" exec toolbox -- nslookup "web.$NS.svc.cluster.local" 2>&1 || true)"
# httpd's default page; each request through the ClusterIP reaches a replica.
# busybox 1.35's wget crashes with -T: the time limit is timeout's.
body=$(kc -n "$NS" exec toolbox -- timeout 10 wget -qO- "http://web/") ||
	die "wget http://web/ from the toolbox pod failed"
grep -q "It works" <<<"$body" || die "http://web/ answered something else than httpd's page: $body"

# ---- 3. exec, logs -f, attach, port-forward, cp -------------------------------------------
step "kubectl exec"
# shellcheck disable=SC2016 # expanded by the pod's shell
out=$(kc -n "$NS" exec toolbox -- sh -c 'echo "$HOSTNAME:$((6 * 7))"')
[[ "$out" == "toolbox:42" ]] || die "kubectl exec printed '$out', not toolbox:42"
# A non-zero exit comes back as kubectl's.
rc=0
kc -n "$NS" exec toolbox -- sh -c 'exit 3' || rc=$?
((rc == 3)) || die "kubectl exec of 'exit 3' exited $rc"

step "kubectl logs -f"
# Follows the log: three lines arrive, then head closes the stream.
lines=$(timeout 30 kubectl --kubeconfig "$KUBECONFIG_ADMIN" -n "$NS" logs -f toolbox | head -n 3) || true
[[ $(grep -c '^line [0-9]*$' <<<"$lines") == 3 ]] || die "kubectl logs -f gave: $lines"

step "kubectl attach"
# What goes into kubectl attach reaches the container's stdin, and its answers come back on
# attach's stdout. The container keeps its stdin open (stdinOnce false), so attach runs until
# it is stopped here.
printf 'ping-1\nping-2\n' | kubectl --kubeconfig "$KUBECONFIG_ADMIN" -n "$NS" attach -i echo -c echo >"$TMP/attach.out" 2>&1 &
attach_pid=$!
for ((i = 0; i < 60; i++)); do
	[[ $(grep -c '^got:ping-[12]$' "$TMP/attach.out") == 2 ]] && break
	sleep 0.5
done
kill "$attach_pid" 2>/dev/null || true
wait "$attach_pid" 2>/dev/null || true
[[ $(grep -c '^got:ping-[12]$' "$TMP/attach.out") == 2 ]] ||
	die "kubectl attach: the container's answers did not come back: $(cat "$TMP/attach.out")"
[[ $(kc -n "$NS" logs echo | grep -c '^got:ping-[12]$') == 2 ]] ||
	die "kubectl attach: the container's log lacks its answers: $(kc -n "$NS" logs echo)"

step "kubectl port-forward"
web_pod=$(kc -n "$NS" get pods -l app=web --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}')
kubectl --kubeconfig "$KUBECONFIG_ADMIN" -n "$NS" port-forward "pod/$web_pod" 0:80 >"$TMP/pf.out" 2>&1 &
PF_PID=$!
port=""
for ((i = 0; i < 60; i++)); do
	port=$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) -> 80$/\1/p' "$TMP/pf.out" | head -n 1)
	[[ -n "$port" ]] && break
	kill -0 "$PF_PID" 2>/dev/null || die "kubectl port-forward exited: $(cat "$TMP/pf.out")"
	sleep 0.5
done
[[ -n "$port" ]] || die "kubectl port-forward named no local port: $(cat "$TMP/pf.out")"
body=$(curl -fsS --max-time 10 "http://127.0.0.1:$port/") || die "nothing through port-forward: $(cat "$TMP/pf.out")"
grep -q "It works" <<<"$body" || die "port-forward reached something else: $body"
kill "$PF_PID" 2>/dev/null || true
wait "$PF_PID" 2>/dev/null || true
PF_PID=""

step "kubectl cp, both ways"
head -c 300000 /dev/urandom >"$TMP/blob"
kc -n "$NS" cp "$TMP/blob" toolbox:/tmp/blob >/dev/null
remote=$(kc -n "$NS" exec toolbox -- md5sum /tmp/blob | cut -d' ' -f1)
[[ "$remote" == "$(md5sum <"$TMP/blob" | cut -d' ' -f1)" ]] || die "kubectl cp into the pod changed the file"
kc -n "$NS" cp toolbox:/tmp/blob "$TMP/back" >/dev/null 2>&1
cmp -s "$TMP/blob" "$TMP/back" || die "kubectl cp out of the pod changed the file"

# ---- 4. a Job and a DaemonSet ----------------------------------------------------------------
step "a Job completes, a DaemonSet runs"
kc -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: batch/v1
kind: Job
metadata: {name: count}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: count
        image: $TOOLBOX_IMAGE
        command: [sh, -c, 'echo "sum=\$((1 + 2 + 3))"']
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: agent
        image: $TOOLBOX_IMAGE
        command: [sh, -c, 'exec sleep 100000']
EOF
kc -n "$NS" wait --for=condition=Complete job/count --timeout=120s >/dev/null
[[ "$(kc -n "$NS" logs job/count)" == "sum=6" ]] || die "the Job's log: $(kc -n "$NS" logs job/count)"
kc -n "$NS" rollout status daemonset/agent --timeout=120s >/dev/null

# ---- 5. drain ------------------------------------------------------------------------------
step "kubectl drain $node"
kc drain "$node" --ignore-daemonsets --delete-emptydir-data --force --grace-period=5 --timeout=180s >/dev/null
# Every pod of the namespace but the DaemonSet's is gone from the node (the Deployment's new
# ones are Pending: the only node is cordoned).
left=$(kc -n "$NS" get pods -o json | jq -r --arg n "$node" \
	'.items[] | select(.spec.nodeName == $n and (.metadata.ownerReferences[0].kind // "") != "DaemonSet" and .status.phase != "Succeeded") | .metadata.name')
[[ -z "$left" ]] || die "after the drain, pods still on $node: $left"
kc uncordon "$node" >/dev/null
kc -n "$NS" rollout status deployment/web --timeout=180s >/dev/null

step "cleaning up the namespace"
kc delete namespace "$NS" --wait=true --timeout=120s >/dev/null
step "smoke passed"
