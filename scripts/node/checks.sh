#!/usr/bin/env bash
# Runs in the node VM (scripts/node-test.sh pipes it to `node-vm.sh ssh -- bash -s -- IMAGE`):
# what differs on a real node, checked with crictl against remora as the package installed it
# and as an operator configures it for kubelet's defaults (systemd cgroup driver):
#   1. a pod and a container in a kubelet-named pod slice: runp, create, start, exec; the
#      container runs in remora-<id>.scope under the slice, confined by remora-default;
#   2. pod and container stats read from cgroup v2, with pressure (PSI);
#   3. an OOM kill under cgroup v2: the kernel's kill, exit code 137 and reason OOMKilled;
#   4. remora restarted by systemd: the container keeps running and answers exec.
# Every failure names the step, prints the error and remora's warnings since the start.
set -euo pipefail
image=$1
say() { printf 'node: %s\n' "$*" >&2; }
since=$(date '+%Y-%m-%d %H:%M:%S')
fail() {
	say "FAILED: $*"
	say "remora's log (warnings and errors) since $since:"
	journalctl -u remora --since "$since" --no-pager -o cat | grep -E ' (WARN|ERRO|CRIT) ' >&2 || true
	exit 1
}
# wait_for SECONDS DESCRIPTION CMD...: CMD until it succeeds, at most SECONDS.
wait_for() {
	local limit=$1 what=$2 end=$((SECONDS + $1))
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS < end)) || fail "$what: not within $limit s"
		sleep 0.5
	done
}

mkdir -p /root/checks
cd /root/checks
grep -q '^cgroup_driver = "systemd"' /etc/remora/config.toml ||
	fail "remora is not configured with cgroup_driver = \"systemd\" (node-install.sh sets it)"
[[ -f /sys/fs/cgroup/cgroup.controllers ]] || fail "the node is not on cgroup v2"
aa-status --enabled || fail "AppArmor is not enabled on the node"
grep -q '^remora-default ' /sys/kernel/security/apparmor/profiles ||
	fail "the package did not load remora-default: $(grep remora /sys/kernel/security/apparmor/profiles || echo none loaded)"

uid=checks-$RANDOM$RANDOM
slice=kubepods-besteffort-pod${uid//-/_}.slice
cat >pod.json <<EOF
{
  "metadata": { "name": "checks", "namespace": "default", "uid": "$uid", "attempt": 0 },
  "log_directory": "/var/log/pods/checks",
  "linux": { "cgroup_parent": "$slice" }
}
EOF
# container NAME MEMORY_LIMIT ARGS...: a container config.
container() {
	local name=$1 limit=$2 args
	shift 2
	args=$(printf '"%s",' "$@")
	cat >"$name.json" <<EOF
{
  "metadata": { "name": "$name" },
  "image": { "image": "$image" },
  "command": [${args%,}],
  "log_path": "$name.log",
  "linux": { "resources": { "memory_limit_in_bytes": $limit } }
}
EOF
}
container sleeper 0 sleep 3600
# dd's 64 MiB buffer cannot fit under a 32 MiB limit.
container hog 33554432 dd if=/dev/zero of=/dev/null bs=64M count=4

crictl pull "$image" >/dev/null || fail "crictl pull $image"

# ---- 1. pod and container under systemd, cgroup v2 and AppArmor --------------------------
pod=$(crictl runp pod.json 2>&1) || fail "runp: $pod"
ctr=$(crictl create "$pod" sleeper.json pod.json 2>&1) || fail "create: $ctr"
out=$(crictl start "$ctr" 2>&1) || fail "start: $out"
out=$(crictl exec "$ctr" echo remora-node-ok 2>&1) || fail "exec: $out"
[[ $out == remora-node-ok ]] || fail "exec answered: $out"
pid=$(crictl inspect -o go-template --template '{{.info.pid}}' "$ctr") || fail "inspect $ctr"
cg=$(cut -d: -f3 "/proc/$pid/cgroup")
want=/kubepods.slice/kubepods-besteffort.slice/$slice/remora-$ctr.scope
[[ $cg == "$want" ]] || fail "container's cgroup is $cg, not $want"
label=$(cat "/proc/$pid/attr/current")
[[ $label == "remora-default (enforce)" ]] || fail "container's AppArmor label is '$label', not remora-default (enforce)"
say "ok: pod $pod, container $ctr in $cg, AppArmor $label"

# ---- 2. stats from cgroup v2 --------------------------------------------------------------
ws=$(crictl stats -o json --id "$ctr" | jq -r '.stats[0].memory.workingSetBytes.value // 0')
((ws > 0)) || fail "container stats: working set $ws"
pws=$(crictl statsp -o json --id "$pod" | jq -r '.stats[0].linux.memory.workingSetBytes.value // .stats[0].memory.workingSetBytes.value // 0')
((pws > 0)) || fail "pod stats: working set $pws"
say "ok: stats: container working set $ws B, pod $pws B"
# Pressure (PSI) from the cgroups' *.pressure files, where the kernel has PSI on. (The proto
# names PsiStats' fields `Full` and `Some`, capitalised, and crictl's JSON keeps them so.)
if [[ -r /proc/pressure/memory ]]; then
	cpsi=$(crictl stats -o json --id "$ctr" | jq -c '.stats[0] | [(.cpu.psi.Some != null), (.memory.psi.Some != null), (.io.psi.Some != null)]')
	[[ $cpsi == "[true,true,true]" ]] || fail "container stats: cpu, memory, io pressure present: $cpsi, not all"
	ppsi=$(crictl statsp -o json --id "$pod" | jq -c '.stats[0].linux | [(.cpu.psi.Some != null), (.memory.psi.Some != null), (.io.psi.Some != null)]')
	[[ $ppsi == "[true,true,true]" ]] || fail "pod stats: cpu, memory, io pressure present: $ppsi, not all"
	say "ok: stats: cpu, memory and io pressure (PSI) in container and pod stats"
else
	say "ok: stats: this kernel has PSI off (/proc/pressure unreadable): no pressure expected"
fi

# ---- 3. OOM under cgroup v2 ---------------------------------------------------------------
hog=$(crictl create "$pod" hog.json pod.json 2>&1) || fail "create hog: $hog"
out=$(crictl start "$hog" 2>&1) || fail "start hog: $out"
exited() { [[ $(crictl inspect -o go-template --template '{{.status.state}}' "$hog") == CONTAINER_EXITED ]]; }
wait_for 120 "the 32 MiB container to exit" exited
status=$(crictl inspect -o go-template --template '{{.status.reason}} {{.status.exitCode}}' "$hog")
# The kernel's kill, from the pod slice's hierarchical counter (cgroup v2).
kills=$(awk '$1 == "oom_kill" {print $2}' "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/$slice/memory.events")
((kills > 0)) || fail "the 32 MiB container ended with '$status' but the pod slice counts no OOM kill"
[[ $status == *" 137" ]] || fail "the OOM-killed container's exit code: '$status', not 137"
# The reason: containerd's Go shim can lose its TaskOOM event here (containerd#8893: it reads
# memory.events after systemd removed the scope) or send it after the exit; remora then reads
# the pod slice's counter against the one taken at the container's start.
[[ $status == "OOMKilled 137" ]] || fail "the OOM-killed container ended with '$status', not 'OOMKilled 137' (pod slice oom_kill $kills)"
say "ok: OOM: OOMKilled 137 (pod slice oom_kill $kills)"

# ---- 4. remora restarted under systemd ----------------------------------------------------
before=$(systemctl show -p MainPID --value remora)
systemctl restart remora || fail "systemctl restart remora"
after=$(systemctl show -p MainPID --value remora)
[[ $after != "$before" && $after != 0 ]] || fail "remora's main pid $before -> $after"
systemctl is-active remora >/dev/null || fail "remora is not active after a restart"
state=$(crictl inspect -o go-template --template '{{.status.state}}' "$ctr") || fail "inspect after restart"
[[ $state == CONTAINER_RUNNING ]] || fail "after remora's restart the container is $state"
out=$(crictl exec "$ctr" echo still-here 2>&1) || fail "exec after restart: $out"
[[ $out == still-here ]] || fail "exec after restart answered: $out"
say "ok: remora restarted (pid $before -> $after); container $ctr still running and answers exec"

crictl stopp "$pod" >/dev/null || fail "stopp"
crictl rmp "$pod" >/dev/null || fail "rmp"
[[ ! -d /sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/$slice/remora-$ctr.scope ]] ||
	fail "the container's scope outlived its pod"
say "checks passed"
