#!/usr/bin/env bash
# Scale benchmark: N pods of one busybox `sleep` container each, started M at a time, on a
# private remora (its default handler, remora's shim unless --handler says otherwise) and then
# on the test bed containerd's own CRI with its Go shim, same load one after the other.
#
#   scripts/bench-scale.sh [--pods N] [--concurrent M] [--handler H] [--containerd-pods N]
#                          [--only remora|containerd] [--bin PATH] [--samples K] [--share-pid]
#                          [--kill] [--poll P]
#
#   --pods N             pods per runtime (default 300)
#   --concurrent M       pods started at once (default 10)
#   --handler H          remora's runtime handler for the pods (default: remora's own default)
#   --containerd-pods N  pods for containerd's CRI (default: --pods)
#   --only RT            one runtime only
#   --bin PATH           the remora binary (default: the release build, built here)
#   --samples K          list-call samples per reading (default 30)
#   --share-pid          pods whose containers share one PID namespace (shareProcessNamespace),
#                        which need a pause container on remora too; by default the pods are
#                        shaped as kubelet sends a pod without it (PID mode CONTAINER for the
#                        pod and its container), which remora runs without one
#                        (`pause_container = "when-needed"`); containerd's CRI always makes one
#   --poll P             kubelet-like stats polling for P periods of 10 s (default 6)
#   --kill               before remora's teardown, SIGKILL it at its load and start it again:
#                        seconds from the kill to its first answer (crictl version), to every
#                        container listed running again, to a new pod running; and its own
#                        resync time (its log's "resync complete")
#
# Per runtime it reports:
#   - pod start (RunPodSandbox + CreateContainer + StartContainer, three crictl calls): the
#     wall time to all running, and one pod's p50/p95;
#   - node memory when all run, by process kind (the daemon; the shims of this run's
#     containerd namespace; pause processes; container processes; containerd for both), RSS
#     and PSS from /proc/PID/smaps_rollup;
#   - list and status calls at N pods (crictl ps -a -q, pods -q, inspect, inspectp, and
#     `version` for crictl's own cost), p50/p95/p99 over K calls each, idle and again while
#     M more pods are being created, kubelet's stats calls among them (stats -a, statsp,
#     metricsp); for remora also the mean time inside it (its metrics, served on
#     127.0.0.1:19338 for the run); and the CPU time per call of containerd, the shims and
#     remora (for remora's run) together;
#   - kubelet-like stats polling at N pods: every 10 s for P periods, one ListContainerStats,
#     ListPodSandboxStats and ListPodSandboxMetrics each; p50/p95/p99 of those calls and the
#     CPU time per period of what serves them (containerd, the shims, remora);
#   - teardown time (stopp + rmp, M at a time) and what is left after it (shims, containers
#     and snapshots in the namespace, pod netns and mounts).
# The load stops early, and says where, when the node has less than 2 GiB available (before
# swap or the OOM killer).
#
# remora here is a private one (own socket and state, containerd namespace
# `remora-bench-scale`, on the test bed's containerd), started fresh; the test bed's remora is
# not touched. Only this script's pods (label bench=scale) are removed. Numbers are reported,
# never asserted; not part of scripts/test.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# pid_mode: the CRI NamespaceMode as a number (1 CONTAINER, 0 POD): crictl's JSON loader
# refuses enum names.
pods=300 m=10 handler='' ctrd_pods='' only='' bin='' samples=30 pid_mode=1 kill_remora='' poll=6
num() { [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive number"; }
while [[ $# -gt 0 ]]; do
	case $1 in
	--pods) num "$@" && pods=$2 && shift 2 ;;
	--concurrent) num "$@" && m=$2 && shift 2 ;;
	--containerd-pods) num "$@" && ctrd_pods=$2 && shift 2 ;;
	--samples) num "$@" && samples=$2 && shift 2 ;;
	--poll) num "$@" && poll=$2 && shift 2 ;;
	--share-pid) pid_mode=0 && shift ;;
	--kill) kill_remora=1 && shift ;;
	--handler)
		[[ $# -ge 2 && $2 =~ ^[a-z0-9-]+$ ]] || die "--handler needs a handler name"
		handler=$2
		shift 2
		;;
	--bin)
		[[ $# -ge 2 && -x $2 ]] || die "--bin needs an executable"
		bin=$2
		shift 2
		;;
	--only)
		[[ $# -ge 2 && ($2 == remora || $2 == containerd) ]] || die "--only remora|containerd"
		only=$2
		shift 2
		;;
	-h | --help)
		sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done
ctrd_pods=${ctrd_pods:-$pods}

if [[ -z "$bin" && $only != containerd ]]; then
	info "cargo build --release --locked --bin remora"
	(cd "$REPO_ROOT" && cargo build --release --locked --bin remora 2>&1 | tail -n 1 >&2)
	bin="$(cargo_target_dir)/release/remora"
fi
CRICTL="$TOOLS_BIN/crictl"
NS=remora-bench-scale
METRICS=127.0.0.1:19338
work=$(mktemp -d)
state="/run/remora-bench-scale-$$"
remora_pid=

# A private remora from the test bed's template, its default handler as shipped unless
# --handler names one.
start_remora() {
	local t shipped
	shipped=$("$bin" config default | awk -F'"' '/^default_handler/ {print $2; exit}')
	[[ -n $shipped ]] || die "could not read default_handler from '$bin config default'"
	handler=${handler:-$shipped}
	t=$(<"$SCRIPTS_DIR/remora-testbed.toml")
	t=${t//@SOCKET@/$work/remora.sock}
	t=${t//@ROOT_DIR@/$work/root}
	t=${t//@STATE_DIR@/$state}
	t=${t//@CONTAINERD_SOCK@/$CONTAINERD_SOCK}
	t=${t//@NAMESPACE@/$NS}
	t=${t//@CERTS_DIR@/$TB_ROOT/certs.d}
	t=${t//@CNI_CONF_DIR@/$TB_ROOT/cni/net.d}
	t=${t//@CNI_BIN_DIR@//usr/lib/cni}
	t=${t//@HANDLER@/$handler}
	t=${t//@RUNC@/$PINNED_RUNC}
	# Its metrics tell how long each call took inside remora, apart from crictl and gRPC.
	t+=$'\n[metrics]\naddress = "'"$METRICS"$'"'
	printf '%s\n' "$t" >"$work/remora.toml"
	"$bin" --config "$work/remora.toml" </dev/null >>"$work/remora.log" 2>&1 &
	remora_pid=$!
	until_answering 0.2 || die "the benchmark's remora did not start"
}

# until_answering PERIOD: asks the private remora for its version every PERIOD seconds, 20 s
# at most; fails (with its log's tail) if it never answers.
until_answering() {
	local t0=$EPOCHREALTIME
	while awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { exit !(b - a < 20) }'; do
		"$CRICTL" --runtime-endpoint "unix://$work/remora.sock" --timeout 2s version >/dev/null 2>&1 && return 0
		sleep "$1"
	done
	tail -n 20 "$work/remora.log" >&2
	return 1
}

since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# kill_and_recover: SIGKILLs the private remora at its current load and starts it again;
# "what seconds" lines to $work/recovery: answering, every container that ran listed running
# again, a new pod running (all from the kill), and remora's own resync time.
kill_and_recover() {
	local want t0 got
	want=$(cri remora ps -q --state running 2>/dev/null | wc -l)
	kill -KILL "$remora_pid"
	wait "$remora_pid" 2>/dev/null || true
	: >"$work/remora.log"
	t0=$EPOCHREALTIME
	"$bin" --config "$work/remora.toml" </dev/null >>"$work/remora.log" 2>&1 &
	remora_pid=$!
	until_answering 0.02 || die "remora did not answer again after the kill"
	echo "answering $(since "$t0")" >"$work/recovery"
	while got=$(cri remora ps -q --state running 2>/dev/null | wc -l) && ((got < want)); do
		awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { exit !(b - a > 60) }' &&
			die "after the kill: $got of $want containers listed running after 60 s"
		sleep 0.02
	done
	echo "listed $(since "$t0")" >>"$work/recovery"
	one_pod remora "scale-remora-after-kill" || warn "remora: no new pod after the kill"
	echo "new-pod $(since "$t0")" >>"$work/recovery"
	echo "resync $(awk -F'took_ms' '/resync complete/ { sub(/^[^0-9]*/, "", $2); sub(/[^0-9].*/, "", $2); printf "%.2f", $2 / 1000; exit }' "$work/remora.log")" >>"$work/recovery"
	info "remora: after a SIGKILL at $want running containers (s): $(tr '\n' ';' <"$work/recovery")"
}

endpoint() { if [[ $1 == remora ]]; then echo "unix://$work/remora.sock"; else echo "unix://$CONTAINERD_SOCK"; fi; }
cri() {
	local ep
	ep=$(endpoint "$1")
	"$CRICTL" --runtime-endpoint "$ep" --image-endpoint "$ep" --timeout 120s "${@:2}"
}
namespace_of() { if [[ $1 == remora ]]; then echo "$NS"; else echo k8s.io; fi; }

# teardown RT: stops and removes this script's pods, M at a time; prints the seconds taken.
teardown() {
	local rt=$1 ids id t0
	t0=$EPOCHREALTIME
	ids=$(cri "$rt" pods --label bench=scale -q 2>/dev/null) || ids=''
	for id in $ids; do
		while (($(running_jobs) >= m)); do wait -n || true; done
		{ cri "$rt" stopp "$id" >/dev/null 2>&1 && cri "$rt" rmp "$id" >/dev/null 2>&1; } ||
			warn "$rt: could not remove pod $id" &
	done
	wait_jobs
	awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'
}

# running_jobs: how many background jobs run, the private remora not counted (none is a job
# of a subshell, where these functions also run).
running_jobs() { jobs -rp | grep -cvx "${remora_pid:-none}" || true; }

# wait_jobs: waits for every background job but the private remora.
wait_jobs() {
	local p
	for p in $(jobs -rp); do
		[[ $p == "${remora_pid:-}" ]] || wait "$p" || true
	done
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	if [[ -n "$remora_pid" ]]; then
		teardown remora >/dev/null || true
		cri remora rmi --all >/dev/null 2>&1 || true
		kill -TERM "$remora_pid" 2>/dev/null || true
		wait "$remora_pid" 2>/dev/null || true
	fi
	[[ $only == remora ]] || teardown containerd >/dev/null || true
	rm -rf "$work"
	if [[ -d "$state" ]]; then
		awk -v d="$state/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
			while read -r mp; do umount -l "$mp" 2>/dev/null || true; done
		rm -rf "$state"
	fi
}
trap cleanup EXIT

# one_pod RT NAME: runs a pod with one busybox container; appends its milliseconds to
# $work/start-RT.
one_pod() {
	local rt=$1 name=$2 pod ctr t0
	cat >"$work/pods/$name-pod.json" <<JSON
{"metadata": {"name": "$name", "namespace": "bench-scale", "uid": "$name-uid"}, "labels": {"bench": "scale"}, "log_directory": "$work/logs/$name", "linux": {"security_context": {"namespace_options": {"pid": $pid_mode}}}}
JSON
	cat >"$work/pods/$name-ctr.json" <<JSON
{"metadata": {"name": "c"}, "image": {"image": "busybox"}, "command": ["sleep", "36000"], "log_path": "c.log", "linux": {"security_context": {"namespace_options": {"pid": $pid_mode}}}}
JSON
	t0=$EPOCHREALTIME
	# crictl's stderr is kept for a failed call only (it warns on every call).
	local err="$work/pods/$name.err"
	if ! pod=$(cri "$rt" runp "$work/pods/$name-pod.json" 2>"$err") ||
		! ctr=$(cri "$rt" create "$pod" "$work/pods/$name-ctr.json" "$work/pods/$name-pod.json" 2>"$err") ||
		! cri "$rt" start "$ctr" >/dev/null 2>"$err"; then
		{
			echo "$name:"
			grep -v 'level=warning' "$err"
		} >>"$work/errors-$rt"
		return 1
	fi
	awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d\n", (b - a) * 1000 }' >>"$work/start-$rt"
}

mem_available_mib() { awk '/^MemAvailable/ {print int($2 / 1024)}' /proc/meminfo; }

# start_pods RT COUNT PREFIX: COUNT pods, M at a time; stops early below 2 GiB available.
# Prints how many were started.
start_pods() {
	local rt=$1 count=$2 prefix=$3 i started=0
	for ((i = 0; i < count; i++)); do
		if ((i % m == 0 && $(mem_available_mib) < 2048)); then
			warn "$rt: stopping at $i pods: $(mem_available_mib) MiB available"
			break
		fi
		while (($(running_jobs) >= m)); do wait -n || true; done
		one_pod "$rt" "$prefix-$i" &
		started=$((i + 1))
	done
	wait_jobs
	echo "$started"
}

# percentiles FILE: "p50 p95 p99" of the numbers in FILE (nearest rank).
percentiles() {
	sort -n "$1" | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "- - -"; exit }
		split("50 95 99", q, " ")
		for (i = 1; i <= 3; i++) { r = int((q[i] * NR + 99) / 100); if (r < 1) r = 1; printf "%s%s", v[r], (i < 3 ? " " : "\n") }
	}'
}

# handler_totals METHOD: "seconds count" of remora's calls of METHOD so far, from its metrics.
handler_totals() {
	curl -fsS "http://$METRICS/metrics" 2>/dev/null | awk -v m="method=\"$1\"" '
		index($1, "remora_cri_request_duration_seconds_sum{") == 1 && index($1, m) { s = $2 }
		index($1, "remora_cri_request_duration_seconds_count{") == 1 && index($1, m) { c = $2 }
		END { print s + 0, c + 0 }'
}

# cpu_ticks RT: CPU time (clock ticks, utime + stime) so far of what serves RT's CRI calls:
# containerd, remora for remora, and the run's shims (containerd's CRI asks each shim for its
# container's stats).
cpu_ticks() {
	local pid files=("/proc/$(<"$TB_RUN/containerd.pid")/stat")
	for pid in $(pgrep -f -- "containerd-shim.* -namespace $(namespace_of "$1") "); do
		files+=("/proc/$pid/stat")
	done
	[[ $1 == remora ]] && files+=("/proc/$remora_pid/stat")
	# A process gone meanwhile is left out.
	{ cat "${files[@]}" 2>/dev/null || true; } | awk '{ sub(/^.*\) /, ""); t += $12 + $13 } END { print t + 0 }'
}

# time_calls RT LABEL METHOD ARGS...: K crictl calls; appends "LABEL p50 p95 p99 mean cpu"
# (ms) to $work/lists-RT, mean being the time inside remora (its metrics; "-" for
# containerd), cpu the CPU time per call of what serves it (cpu_ticks).
time_calls() {
	local rt=$1 label=$2 method=$3 k t0 f="$work/calls" before after ticks
	shift 3
	: >"$f"
	[[ $rt == remora ]] && before=$(handler_totals "$method")
	ticks=$(cpu_ticks "$rt")
	for ((k = 0; k < samples; k++)); do
		t0=$EPOCHREALTIME
		cri "$rt" "$@" >/dev/null 2>&1 || warn "$rt: crictl $* failed"
		awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f\n", (b - a) * 1000 }' >>"$f"
	done
	local inside=-
	if [[ $rt == remora ]]; then
		after=$(handler_totals "$method")
		inside=$(awk -v a="$before" -v b="$after" 'BEGIN {
			split(a, x, " "); split(b, y, " ")
			if (y[2] > x[2]) printf "%.2f", (y[1] - x[1]) * 1000 / (y[2] - x[2]); else print "-" }')
	fi
	local cpu
	cpu=$(awk -v a="$ticks" -v b="$(cpu_ticks "$rt")" -v k="$samples" -v hz="$(getconf CLK_TCK)" \
		'BEGIN { printf "%.1f", (b - a) * 1000 / hz / k }')
	echo "$label $(percentiles "$f") $inside $cpu" >>"$work/lists-$rt"
}

# poll_stats RT: kubelet's stats polling, paced: every 10 s for $poll periods, the three
# stats calls once each (its /stats/summary and /metrics/cadvisor). Appends "poll p50 p95 p99
# - cpu", cpu being the CPU time (ms) per 10 s period of what serves RT (cpu_ticks).
poll_stats() {
	local rt=$1 k call start t0 rest ticks f="$work/poll"
	: >"$f"
	ticks=$(cpu_ticks "$rt")
	for ((k = 0; k < poll; k++)); do
		start=$EPOCHREALTIME
		for call in "stats -a -o json" "statsp -o json" metricsp; do
			t0=$EPOCHREALTIME
			# shellcheck disable=SC2086 # the call's words
			cri "$rt" $call >/dev/null 2>&1 || warn "$rt: crictl $call failed"
			awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f\n", (b - a) * 1000 }' >>"$f"
		done
		rest=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { r = 10 - (b - a); printf "%.3f", (r > 0 ? r : 0) }')
		sleep "$rest"
	done
	local cpu
	cpu=$(awk -v a="$ticks" -v b="$(cpu_ticks "$rt")" -v k="$poll" -v hz="$(getconf CLK_TCK)" \
		'BEGIN { printf "%.1f", (b - a) * 1000 / hz / k }')
	echo "poll $(percentiles "$f") - $cpu" >>"$work/lists-$rt"
}

# list_readings RT SUFFIX: the list and status calls at the current size.
list_readings() {
	local rt=$1 sfx=$2 pod ctr
	# awk, not head: head's early exit would fail the pipeline (pipefail) on a long list.
	pod=$(cri "$rt" pods --label bench=scale -q | awk 'NR == 1')
	ctr=$(cri "$rt" ps -q --pod "$pod" | awk 'NR == 1')
	time_calls "$rt" "version$sfx" Version version
	time_calls "$rt" "ps-a-q$sfx" ListContainers ps -a -q
	time_calls "$rt" "pods-q$sfx" ListPodSandbox pods -q
	time_calls "$rt" "inspect$sfx" ContainerStatus inspect "$ctr"
	time_calls "$rt" "inspectp$sfx" PodSandboxStatus inspectp "$pod"
	# kubelet's stats calls (its /stats/summary and, with PodAndContainerStatsFromCRI,
	# /metrics/cadvisor), every pod at once.
	time_calls "$rt" "stats$sfx" ListContainerStats stats -a -o json
	time_calls "$rt" "statsp$sfx" ListPodSandboxStats statsp -o json
	time_calls "$rt" "metricsp$sfx" ListPodSandboxMetrics metricsp
}

# memory RT PID: node memory by process kind, "kind count rss_kib pss_kib" lines to $work/mem-RT.
memory() {
	python3 - "$(namespace_of "$1")" "$2" "$(<"$TB_RUN/containerd.pid")" >"$work/mem-$1" <<'PY'
import os, sys
ns, daemon, containerd = sys.argv[1], sys.argv[2], sys.argv[3]
procs = {}
for p in os.listdir('/proc'):
    if not p.isdigit():
        continue
    try:
        with open(f'/proc/{p}/stat') as f:
            stat = f.read()
        with open(f'/proc/{p}/cmdline', 'rb') as f:
            argv = f.read().split(b'\0')
    except OSError:
        continue
    comm = stat[stat.index('(') + 1:stat.rindex(')')]
    ppid = stat[stat.rindex(')') + 2:].split()[1]
    procs[p] = (ppid, comm, [a.decode(errors='replace') for a in argv])
def is_shim(argv):
    return (argv and 'containerd-shim' in os.path.basename(argv[0])
            and '-namespace' in argv and argv[argv.index('-namespace') + 1:][:1] == [ns])
kind = {}
for p, (_, _, argv) in procs.items():
    if is_shim(argv):
        kind[p] = 'shims'
kind[daemon] = 'daemon'
kind[containerd] = 'containerd'
def shim_child(p):
    seen = 0
    while p in procs and seen < 64:
        ppid = procs[p][0]
        if kind.get(ppid) == 'shims':
            return True
        p, seen = ppid, seen + 1
    return False
for p, (_, comm, _) in procs.items():
    if p not in kind and shim_child(p):
        kind[p] = 'pause' if comm == 'pause' else 'containers'
totals = {}
for p, k in kind.items():
    rss = pss = 0
    try:
        with open(f'/proc/{p}/smaps_rollup') as f:
            for line in f:
                if line.startswith('Rss:'):
                    rss = int(line.split()[1])
                elif line.startswith('Pss:'):
                    pss = int(line.split()[1])
    except OSError:
        continue
    n, r, s = totals.get(k, (0, 0, 0))
    totals[k] = (n + 1, r + rss, s + pss)
for k in ('containerd', 'daemon', 'shims', 'pause', 'containers'):
    n, r, s = totals.get(k, (0, 0, 0))
    print(k, n, r, s)
PY
}

# leftovers RT: what is left of the run in containerd and on the host, "what count" lines.
leftovers() {
	local rt=$1 ns
	ns=$(namespace_of "$rt")
	{
		echo "shims $(pgrep -f -c -- "containerd-shim.* -namespace $ns " || true)"
		echo "containers $(ctr_cmd -n "$ns" containers ls -q | wc -l)"
		echo "tasks $(ctr_cmd -n "$ns" tasks ls -q | wc -l)"
		if [[ $rt == remora ]]; then
			echo "snapshots $(ctr_cmd -n "$ns" snapshots ls | tail -n +2 | grep -vc Committed || true)"
			echo "state-mounts $(awk -v d="$state/" 'index($5, d) == 1' /proc/self/mountinfo | wc -l)"
		fi
	} >"$work/left-$rt"
}
ctr_cmd() { "$TOOLS_BIN/ctr" --address "$CONTAINERD_SOCK" "$@" 2>/dev/null || true; }

mkdir -p "$work/pods" "$work/logs"
declare -A n_started wall teardown_s
for rt in remora containerd; do
	[[ -n $only && $only != "$rt" ]] && continue
	if [[ $rt == remora ]]; then
		start_remora
		pid=$remora_pid
		n=$pods
	else
		pid=$(<"$TB_RUN/containerd.pid")
		n=$ctrd_pods
	fi
	cri "$rt" pull busybox >/dev/null 2>&1 || die "$rt: pull busybox failed"
	cri "$rt" pull "registry.k8s.io/pause:3.10" >/dev/null 2>&1 || die "$rt: pull pause failed"
	: >"$work/start-$rt"
	: >"$work/lists-$rt"
	info "$rt: $n pods, $m at a time"
	t0=$EPOCHREALTIME
	n_started[$rt]=$(start_pods "$rt" "$n" "scale-$rt")
	wall[$rt]=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
	info "$rt: ${n_started[$rt]} pods in ${wall[$rt]} s ($(wc -l <"$work/start-$rt") started)"
	sleep 5
	memory "$rt" "$pid"
	# Each reading is logged as it is taken, so that a run cut short keeps what it had.
	info "$rt: memory (kind count rss_kib pss_kib): $(tr '\n' ';' <"$work/mem-$rt")"
	info "$rt: list and status calls at ${n_started[$rt]} pods"
	list_readings "$rt" ""
	info "$rt: kubelet-like stats polling, $poll periods of 10 s"
	poll_stats "$rt"
	info "$rt: the same while $m more pods are being created"
	start_pods "$rt" "$m" "scale-$rt-more" >/dev/null &
	more=$!
	list_readings "$rt" "+create"
	wait "$more" || true
	info "$rt: calls (label p50 p95 p99 inside-remora-mean, ms): $(tr '\n' ';' <"$work/lists-$rt")"
	[[ $rt == remora && -n $kill_remora ]] && kill_and_recover
	info "$rt: teardown"
	teardown_s[$rt]=$(teardown "$rt")
	if [[ $rt == remora ]]; then
		cri remora rmi --all >/dev/null 2>&1 || true
		# Stopped first: at a clean stop remora unmounts its netns directory.
		kill -TERM "$remora_pid" 2>/dev/null || true
		wait "$remora_pid" 2>/dev/null || true
		remora_pid=
	fi
	leftovers "$rt"
done

# ---- report -------------------------------------------------------------------------------
col() { awk -v k="$2" -v c="$3" '$1 == k { print $c; exit }' "$work/$1" 2>/dev/null; }
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'; }
row() { printf '%-44s %12s %12s %8s\n' "$1" "${2:--}" "${3:--}" "$(ratio "${2:-}" "${3:-}")"; }
echo
echo "bench-scale: remora (handler ${handler:-?}, $(basename "${bin:-none}")) vs containerd's CRI (Go shim); $m at a time; $(nproc) CPUs"
printf '%-44s %12s %12s %8s\n' "" remora containerd ratio
row "pods started" "${n_started[remora]:-}" "${n_started[containerd]:-}"
row "wall time to all running (s)" "${wall[remora]:-}" "${wall[containerd]:-}"
for q in 1 2; do
	name=$([[ $q == 1 ]] && echo p50 || echo p95)
	# With --only, the other runtime's file is empty: a failed `[[ ]]` inside `$()` ended the
	# report there (set -e).
	a='' b=''
	if [[ -s $work/start-remora ]]; then a=$(percentiles "$work/start-remora" | cut -d' ' -f"$q"); fi
	if [[ -s $work/start-containerd ]]; then b=$(percentiles "$work/start-containerd" | cut -d' ' -f"$q"); fi
	row "one pod's start, $name (ms)" "$a" "$b"
done
for k in containerd daemon shims pause containers; do
	for c in 3 4; do
		unit=$([[ $c == 3 ]] && echo RSS || echo PSS)
		row "$k $unit (MiB; count $(col mem-remora "$k" 2)/$(col mem-containerd "$k" 2))" \
			"$(awk -v v="$(col mem-remora "$k" "$c")" 'BEGIN { if (v != "") printf "%.1f", v / 1024 }')" \
			"$(awk -v v="$(col mem-containerd "$k" "$c")" 'BEGIN { if (v != "") printf "%.1f", v / 1024 }')"
	done
done
# Node PSS: containerd + the CRI daemon (remora, or containerd itself) + shims + pause.
node_pss() { awk '$1 != "containers" { s += $4 } END { if (NR) printf "%.1f", s / 1024 }' "$work/mem-$1" 2>/dev/null; }
row "node PSS, containers' own excluded (MiB)" "$(node_pss remora)" "$(node_pss containerd)"
per_pod() { awk -v t="$(node_pss "$1")" -v n="${n_started[$1]:-0}" 'BEGIN { if (t != "" && n > 0) printf "%.2f", t / n }'; }
row "  per pod (MiB)" "$(per_pod remora)" "$(per_pod containerd)"
for label in version ps-a-q pods-q inspect inspectp stats statsp metricsp; do
	for sfx in "" "+create"; do
		for c in 2 3 4; do
			name=$(case $c in 2) echo p50 ;; 3) echo p95 ;; 4) echo p99 ;; esac)
			row "crictl $label$sfx $name (ms)" "$(col lists-remora "$label$sfx" "$c")" "$(col lists-containerd "$label$sfx" "$c")"
		done
		row "  the call inside remora, mean (ms)" "$(col lists-remora "$label$sfx" 5)" ""
		row "  CPU per call, daemons and shims (ms)" "$(col lists-remora "$label$sfx" 6)" "$(col lists-containerd "$label$sfx" 6)"
	done
done
for c in 2 3 4; do
	name=$(case $c in 2) echo p50 ;; 3) echo p95 ;; 4) echo p99 ;; esac)
	row "stats polled every 10 s, a call $name (ms)" "$(col lists-remora poll "$c")" "$(col lists-containerd poll "$c")"
done
row "  CPU per 10 s period, daemons and shims (ms)" "$(col lists-remora poll 6)" "$(col lists-containerd poll 6)"
for what in answering listed new-pod resync; do
	[[ -s $work/recovery ]] && row "after a SIGKILL: $what (s)" "$(col recovery "$what" 2)" ""
done
row "teardown (s)" "${teardown_s[remora]:-}" "${teardown_s[containerd]:-}"
for what in shims containers tasks snapshots state-mounts; do
	row "left after teardown: $what" "$(col left-remora "$what" 2)" "$(col left-containerd "$what" 2)"
done
for rt in remora containerd; do
	[[ -s $work/errors-$rt ]] && warn "$rt: $(grep -c ':$' "$work/errors-$rt") pods failed, the first: $(head -n 4 "$work/errors-$rt")"
done
exit 0
