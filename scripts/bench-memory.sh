#!/usr/bin/env bash
# Daemon memory benchmark, remora vs the test bed containerd (which serves its CRI in-process),
# same load one after the other: RSS (VmRSS) fresh, with 20 pods up, with 100 pods up, and
# idle after the load (the 100 pods removed, then pod cycles — start M pods at once, remove
# them — until CYCLES pods have run in all; then 10 s idle). A pod is a pause sandbox and one
# busybox `sleep` container (RunPodSandbox + CreateContainer + StartContainer, crictl).
# With --big-pulls N, a working day's image traffic too: after the cycles (and a reading 10 s
# later) N pulls, one after another, of a 512 MiB image (8 layers of 64 MiB of random,
# incompressible data; a fresh one each time, generated and pushed to the local registry just
# before, as in bench-pull-big.sh), each removed (crictl rmi) after its pull; RSS peak during
# the pulls (sampled every 0.1 s), right after the last removal, and the idle reading 10 s
# later.
#
#   scripts/bench-memory.sh [--cycles N] [--concurrent M] [--big-pulls N] [--bin PATH]
#                           [--env VAR=VALUE]... [--only remora|containerd] [--metrics ADDR]
#
#   --cycles N      pods started and removed in all (default 900, the first 100 included)
#   --concurrent M  pods started at once in the cycles (default 10)
#   --big-pulls N   512 MiB image pulls after the cycles (default 0)
#   --bin PATH      the remora binary (default: the release build, built here in
#                   CARGO_TARGET_DIR if set)
#   --env VAR=VAL   environment for remora (repeatable), e.g. MALLOC_ARENA_MAX=2 or
#                   MALLOC_TRIM_THRESHOLD_=0, to compare allocator settings
#   --metrics ADDR  serve remora's metrics on ADDR ([metrics] address, e.g. 127.0.0.1:9338)
#                   and scrape them at each RSS reading, to measure the endpoint's cost
#
# Also printed: the mean time of one pod (runp + create + start, crictl) over the first 100,
# started one after another.
#
# remora here is a private one (own socket, state dirs and containerd namespace
# `remora-bench-mem`, on the test bed's containerd), started fresh for the run; the test
# bed's own remora is not touched. containerd cannot be restarted on a shared bed: its "fresh"
# is its RSS before this run's load. Only this script's pods and images are removed (the
# private remora's namespace is emptied at exit). Numbers are reported, never asserted; not
# part of scripts/test.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cycles=900 m=10 big_pulls=0 bin='' only='' metrics='' envs=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--cycles | --concurrent)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive number"
		[[ $1 == --cycles ]] && cycles=$2 || m=$2
		shift 2
		;;
	--big-pulls)
		[[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || die "$1 needs a number"
		big_pulls=$2
		shift 2
		;;
	--bin)
		[[ $# -ge 2 && -x $2 ]] || die "--bin needs an executable"
		bin=$2
		shift 2
		;;
	--env)
		[[ $# -ge 2 && $2 == *=* ]] || die "--env needs VAR=VALUE"
		envs+=("$2")
		shift 2
		;;
	--metrics)
		[[ $# -ge 2 && $2 =~ ^[0-9.]+:[0-9]+$ ]] || die "--metrics needs ip:port"
		metrics=$2
		shift 2
		;;
	--only)
		[[ $# -ge 2 && ($2 == remora || $2 == containerd) ]] || die "--only remora|containerd"
		only=$2
		shift 2
		;;
	-h | --help)
		sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done
((cycles >= 100)) || die "--cycles must be at least 100 (the 100 pods are part of them)"

if [[ -z "$bin" && $only != containerd ]]; then
	info "cargo build --release --locked --bin remora"
	(cd "$REPO_ROOT" && cargo build --release --locked --bin remora 2>&1 | tail -n 1 >&2)
	bin="$(cargo_target_dir)/release/remora"
fi
CRICTL="$TOOLS_BIN/crictl"
work=$(mktemp -d)
state="/run/remora-bench-mem-$$"
remora_pid=

# A private remora from the test bed's template.
start_remora() {
	local t
	t=$(<"$SCRIPTS_DIR/remora-testbed.toml")
	t=${t//@SOCKET@/$work/remora.sock}
	t=${t//@ROOT_DIR@/$work/root}
	t=${t//@STATE_DIR@/$state}
	t=${t//@CONTAINERD_SOCK@/$CONTAINERD_SOCK}
	t=${t//@NAMESPACE@/remora-bench-mem}
	t=${t//@CERTS_DIR@/$TB_ROOT/certs.d}
	t=${t//@CNI_CONF_DIR@/$TB_ROOT/cni/net.d}
	t=${t//@CNI_BIN_DIR@//usr/lib/cni}
	t=${t//@HANDLER@/runc}
	t=${t//@RUNC@/$PINNED_RUNC}
	[[ -n $metrics ]] && t+=$'\n[metrics]\naddress = "'"$metrics"$'"'
	printf '%s\n' "$t" >"$work/remora.toml"
	env "${envs[@]}" "$bin" --config "$work/remora.toml" </dev/null >"$work/remora.log" 2>&1 &
	remora_pid=$!
	local i
	for ((i = 0; i < 100; i++)); do
		"$CRICTL" --runtime-endpoint "unix://$work/remora.sock" --timeout 2s version >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	tail -n 20 "$work/remora.log" >&2
	die "the benchmark's remora did not start"
}

endpoint() { if [[ $1 == remora ]]; then echo "unix://$work/remora.sock"; else echo "unix://$CONTAINERD_SOCK"; fi; }
cri() {
	local ep
	ep=$(endpoint "$1")
	"$CRICTL" --runtime-endpoint "$ep" --image-endpoint "$ep" --timeout 60s "${@:2}"
}

# remove_pods RUNTIME: this script's pods only (label bench=memory).
remove_pods() {
	local ids
	ids=$(cri "$1" pods --label bench=memory -q 2>/dev/null) || return 0
	[[ -z "$ids" ]] && return 0
	# shellcheck disable=SC2086 # one id per word
	cri "$1" rmp -f $ids >/dev/null 2>&1 || warn "could not remove every benchmark pod of $1"
}

# The big image being pulled: its runtime, repository and push_random.py's JSON (for cleanup).
big_rt='' big_repo='' big_json=''
# forget_big: removes the big image from its runtime and from the registry.
forget_big() {
	[[ -n $big_repo ]] || return 0
	cri "$big_rt" rmi "registry.k8s.io/$big_repo:v1" >/dev/null 2>&1 || true
	forget_pushed "$big_repo" "$big_json"
	big_repo=''
}

cleanup() {
	forget_big
	if [[ -n "$remora_pid" ]]; then
		remove_pods remora
		# Its namespace holds nothing but this run's images.
		cri remora rmi --all >/dev/null 2>&1 || warn "could not remove the benchmark remora's images"
		kill -TERM "$remora_pid" 2>/dev/null || true
		wait "$remora_pid" 2>/dev/null || true
	fi
	[[ $only == remora ]] || remove_pods containerd
	rm -rf "$work"
	# The private remora's netns and pod-file mounts are gone with its pods.
	if [[ -d "$state" ]]; then
		awk -v d="$state/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
			while read -r mp; do umount -l "$mp" 2>/dev/null || true; done
		rm -rf "$state"
	fi
}
trap cleanup EXIT

# one_pod RUNTIME NAME: runs a pod with one busybox container.
one_pod() {
	local rt=$1 name=$2 pod ctr
	cat >"$work/$name-pod.json" <<JSON
{"metadata": {"name": "$name", "namespace": "bench-memory", "uid": "$name-uid"}, "labels": {"bench": "memory"}, "log_directory": "$work/logs/$name", "linux": {}}
JSON
	cat >"$work/$name-ctr.json" <<JSON
{"metadata": {"name": "c"}, "image": {"image": "busybox"}, "command": ["sleep", "3600"], "log_path": "c.log", "linux": {}}
JSON
	pod=$(cri "$rt" runp "$work/$name-pod.json" 2>/dev/null) || return 1
	ctr=$(cri "$rt" create "$pod" "$work/$name-ctr.json" "$work/$name-pod.json" 2>/dev/null) || return 1
	cri "$rt" start "$ctr" >/dev/null 2>&1
}

# rss_kb PID: its RSS; with --metrics, remora's endpoint is scraped first (its cost counts).
rss_kb() {
	if [[ -n $metrics && $1 == "${remora_pid:-}" ]]; then
		curl -fsS "http://$metrics/metrics" >/dev/null || warn "metrics scrape failed"
	fi
	awk '/^VmRSS/ {print $2}' "/proc/$1/status"
}

# sample_peak PID FILE: writes PID's highest RSS so far (KiB) to FILE, every 0.1 s, until killed.
sample_peak() {
	local max=0 k v
	while :; do
		while read -r k v _; do
			[[ $k == VmRSS: ]] && ((v > max)) && max=$v && echo "$max" >"$2"
		done <"/proc/$1/status"
		sleep 0.1
	done
}

# big_pulls RT PID: the --big-pulls pulls through RT (daemon PID); sets the after-cycles,
# peak, after-pulls readings and the pulls' mean wall time (ms).
big_pulls() {
	local rt=$1 pid=$2 k t0 total=0 sampler
	sleep 10
	p_cycles[$rt]=$(rss_kb "$pid")
	echo 0 >"$work/peak"
	for ((k = 0; k < big_pulls; k++)); do
		info "$rt: 512 MiB pull $((k + 1)) of $big_pulls (pushing a fresh image first)"
		big_rt=$rt big_repo="bench-mem/$rt-$k-$(date +%s%N)"
		big_json=$(push_random_layers "$big_repo" 8 64)
		sample_peak "$pid" "$work/peak" &
		sampler=$!
		t0=$(date +%s%N)
		"$CRICTL" --runtime-endpoint "$(endpoint "$rt")" --image-endpoint "$(endpoint "$rt")" \
			--timeout 600s pull "registry.k8s.io/$big_repo:v1" >/dev/null ||
			die "$rt: pull of the 512 MiB image failed"
		total=$((total + ($(date +%s%N) - t0) / 1000000))
		kill "$sampler"
		wait "$sampler" 2>/dev/null || true
		cri "$rt" rmi "registry.k8s.io/$big_repo:v1" >/dev/null || warn "$rt: rmi failed"
		forget_big
	done
	peak[$rt]=$(<"$work/peak")
	p_pulls[$rt]=$(rss_kb "$pid")
	pull_ms[$rt]=$((total / big_pulls))
}

declare -A fresh p20 p100 idle per_pod p_cycles peak p_pulls pull_ms
for rt in remora containerd; do
	[[ -n $only && $only != "$rt" ]] && continue
	if [[ $rt == remora ]]; then
		start_remora
		pid=$remora_pid
	else
		pid=$(<"$TB_RUN/containerd.pid")
	fi
	cri "$rt" pull busybox >/dev/null
	cri "$rt" pull "registry.k8s.io/pause:3.10" >/dev/null
	sleep 2
	fresh[$rt]=$(rss_kb "$pid")
	info "$rt: 100 pods"
	t0=$(date +%s%N)
	for ((i = 0; i < 100; i++)); do
		one_pod "$rt" "mem-$rt-$i" || die "$rt: pod $i failed"
		((i == 19)) && p20[$rt]=$(rss_kb "$pid")
	done
	per_pod[$rt]=$((($(date +%s%N) - t0) / 100000000))
	p100[$rt]=$(rss_kb "$pid")
	remove_pods "$rt"
	info "$rt: $((cycles - 100)) more pods, $m at a time"
	for ((done_ = 100; done_ < cycles; done_ += m)); do
		batch=()
		for ((j = 0; j < m; j++)); do
			one_pod "$rt" "mem-$rt-c$done_-$j" &
			batch+=($!)
		done
		# Not a bare `wait`: remora is a child of this shell too.
		wait "${batch[@]}" || warn "$rt: a pod of the batch failed"
		remove_pods "$rt"
	done
	((big_pulls > 0)) && big_pulls "$rt" "$pid"
	sleep 10
	idle[$rt]=$(rss_kb "$pid")
done

echo "daemon RSS (KiB): remora $(basename "${bin:-none}")${envs[*]:+ with ${envs[*]}}${metrics:+ with metrics on $metrics} vs containerd (CRI in-process); $cycles pods in all, $m at a time after the first 100; $big_pulls pulls of 512 MiB"
printf '%-34s %10s %12s %10s\n' "" remora containerd remora/ctrd
row() { printf '%-34s %10s %12s %10s\n' "$1" "${2:--}" "${3:--}" "$(awk -v a="${2:-0}" -v b="${3:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')"; }
row "fresh (images pulled)" "${fresh[remora]:-}" "${fresh[containerd]:-}"
row "with 20 pods" "${p20[remora]:-}" "${p20[containerd]:-}"
row "with 100 pods" "${p100[remora]:-}" "${p100[containerd]:-}"
if ((big_pulls > 0)); then
	row "after the cycles, 10 s idle" "${p_cycles[remora]:-}" "${p_cycles[containerd]:-}"
	row "peak during the 512 MiB pulls" "${peak[remora]:-}" "${peak[containerd]:-}"
	row "after the pulls, images removed" "${p_pulls[remora]:-}" "${p_pulls[containerd]:-}"
fi
row "idle after the load, 0 pods" "${idle[remora]:-}" "${idle[containerd]:-}"
row "one pod of the first 100 (ms)" "${per_pod[remora]:-}" "${per_pod[containerd]:-}"
((big_pulls > 0)) && row "one 512 MiB pull (ms)" "${pull_ms[remora]:-}" "${pull_ms[containerd]:-}"
