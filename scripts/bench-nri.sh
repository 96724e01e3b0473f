#!/usr/bin/env bash
# What NRI costs a pod's start: remora's release build on the test bed, three times in one run
# with the same pods (RunPodSandbox + CreateContainer + StartContainer through crictl, as
# bench-pods.sh does): NRI off (`[nri] enable = false`), on with no plugin, and on with one
# plugin connected (nri-stub-logger, NRI's Go pkg/stub, subscribed to every event, writing each
# to a file). Per-pod latency p50/p95 of N pods started one after another, as ratios to NRI off.
#
#   scripts/bench-nri.sh [--n N]
#
# Each mode runs its own remora (own socket, state and containerd namespace, as the
# integration tests' remoras) beside the test bed's. Numbers are reported, never asserted.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n=30
while [[ $# -gt 0 ]]; do
	case $1 in
	--n) n=$2; shift 2 ;;
	*) die "unknown argument $1" ;;
	esac
done

CRICTL="$TOOLS_BIN/crictl"
CTR="$TOOLS_BIN/ctr"
# As scripts/testbed.sh has them.
CERTS_DIR="$TB_ROOT/certs.d"
CNI_CONF_DIR="$TB_ROOT/cni/net.d"
CNI_BIN_DIR=/usr/lib/cni
PLUGIN="$TOOLS_BIN/nri-stub-logger"
[[ -x "$PLUGIN" ]] || die "$PLUGIN is missing; run scripts/setup.sh nri-plugin"
[[ -S "$CONTAINERD_SOCK" ]] || die "the test bed is not up (scripts/testbed.sh up)"
info "cargo build --release --locked --bin remora"
(cd "$REPO_ROOT" && cargo build --release --locked --bin remora 2>&1 | tail -n 1 >&2)
REMORA="$(cargo_target_dir)/release/remora"

work=$(mktemp -d /tmp/bench-nri.XXXXXX)
remora_pid=''
plugin_pid=''
cleanup() {
	if [[ -n "$plugin_pid" ]]; then kill "$plugin_pid" 2>/dev/null || true; fi
	if [[ -n "$remora_pid" ]]; then
		kill "$remora_pid" 2>/dev/null || true
		wait "$remora_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# start_remora MODE: a remora of its own for MODE (off | idle | plugin) in $work/MODE.
start_remora() {
	local mode=$1 dir="$work/$1" t
	mkdir -p "$dir"
	t=$(<"$SCRIPTS_DIR/remora-testbed.toml")
	t=${t//@SOCKET@/$dir/remora.sock}
	t=${t//@ROOT_DIR@/$dir/root}
	t=${t//@STATE_DIR@/$dir/state}
	t=${t//@CONTAINERD_SOCK@/$CONTAINERD_SOCK}
	t=${t//@NAMESPACE@/bench-nri-$mode}
	t=${t//@CERTS_DIR@/$CERTS_DIR}
	t=${t//@CNI_CONF_DIR@/$CNI_CONF_DIR}
	t=${t//@CNI_BIN_DIR@/$CNI_BIN_DIR}
	t=${t//@HANDLER@/remora}
	t=${t//@RUNC@/$PINNED_RUNC}
	# NRI's own request timeout, not the test bed's longer one.
	t=${t//request_timeout = \"5s\"/request_timeout = \"2s\"}
	if [[ $mode == off ]]; then
		t=${t//\[nri\]/[nri]$'\n'enable = false}
	fi
	printf '%s\n' "$t" >"$dir/remora.toml"
	"$REMORA" --config "$dir/remora.toml" >"$dir/remora.log" 2>&1 &
	remora_pid=$!
	local i
	for ((i = 0; i < 300; i++)); do
		crictl_at "$mode" version >/dev/null 2>&1 && return 0
		kill -0 "$remora_pid" 2>/dev/null || die "remora ($mode) exited; see $dir/remora.log"
		sleep 0.1
	done
	die "remora ($mode) did not answer; see $dir/remora.log"
}

# crictl's warnings (no crictl.yaml, no cgroup parent) go to a file, not the report.
crictl_at() { "$CRICTL" --runtime-endpoint "unix://$work/$1/remora.sock" --image-endpoint "unix://$work/$1/remora.sock" --timeout 60s "${@:2}" 2>>"$work/crictl.err"; }

stop_remora() {
	kill "$remora_pid" 2>/dev/null || true
	wait "$remora_pid" 2>/dev/null || true
	remora_pid=
}

# one_pod MODE NAME: a pod with one busybox container; prints its latency in ms.
one_pod() {
	local mode=$1 name=$2 start end pod ctr
	cat >"$work/$name-pod.json" <<JSON
{"metadata": {"name": "$name", "namespace": "bench", "uid": "$name-uid"}, "log_directory": "$work/logs/$name", "linux": {}}
JSON
	cat >"$work/$name-ctr.json" <<JSON
{"metadata": {"name": "c"}, "image": {"image": "busybox"}, "command": ["sleep", "3600"], "log_path": "c.log", "linux": {}}
JSON
	start=$(date +%s%N)
	pod=$(crictl_at "$mode" runp "$work/$name-pod.json")
	ctr=$(crictl_at "$mode" create "$pod" "$work/$name-ctr.json" "$work/$name-pod.json")
	crictl_at "$mode" start "$ctr" >/dev/null
	end=$(date +%s%N)
	echo $(((end - start) / 1000000))
}

percentile() { sort -n | awk -v p="$1" '{a[NR] = $1} END {i = int((NR * p + 99) / 100); if (i < 1) i = 1; print a[i]}'; }

declare -A p50 p95
for mode in off idle plugin; do
	start_remora "$mode"
	crictl_at "$mode" pull busybox >/dev/null
	if [[ $mode == plugin ]]; then
		"$PLUGIN" -socket-path "$work/$mode/state/nri.sock" -idx 10 -name bench \
			-log-file "$work/plugin.log" >"$work/plugin.out" 2>&1 &
		plugin_pid=$!
		for ((i = 0; i < 100; i++)); do
			grep -q "plugin synchronized and active" "$work/$mode/remora.log" && break
			sleep 0.1
		done
		grep -q "plugin synchronized and active" "$work/$mode/remora.log" ||
			die "the plugin did not register; see $work/plugin.out"
	fi
	# One pod first, not counted: the first start pays for caches.
	one_pod "$mode" "$mode-warm" >/dev/null
	: >"$work/$mode-seq"
	for ((i = 0; i < n; i++)); do one_pod "$mode" "$mode-$i" >>"$work/$mode-seq"; done
	p50[$mode]=$(percentile 50 <"$work/$mode-seq")
	p95[$mode]=$(percentile 95 <"$work/$mode-seq")
	if [[ $mode == plugin ]]; then
		events=$(grep -c . "$work/plugin.log" || true)
		info "the plugin recorded $events lines"
	fi
	crictl_at "$mode" rmp -af >/dev/null
	stop_remora
	if [[ -n "$plugin_pid" ]]; then
		kill "$plugin_pid" 2>/dev/null || true
		wait "$plugin_pid" 2>/dev/null || true
		plugin_pid=
	fi
	# The namespace goes with its images (their snapshots are collected).
	ns="bench-nri-$mode"
	"$CTR" --address "$CONTAINERD_SOCK" -n "$ns" images ls -q | xargs -r "$CTR" --address "$CONTAINERD_SOCK" -n "$ns" images rm >/dev/null 2>&1 || true
	"$CTR" --address "$CONTAINERD_SOCK" namespaces rm "$ns" >/dev/null 2>&1 || true
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
echo
echo "NRI cost on pod start ($n pods one after another; RunPodSandbox + CreateContainer + StartContainer)"
printf '%-34s %10s %10s %12s %12s\n' "remora" "p50 ms" "p95 ms" "p50 / off" "p95 / off"
for mode in off idle plugin; do
	case $mode in
	off) label="NRI off" ;;
	idle) label="NRI on, no plugin" ;;
	plugin) label="NRI on, one plugin (every event)" ;;
	esac
	printf '%-34s %10s %10s %12s %12s\n' "$label" "${p50[$mode]}" "${p95[$mode]}" \
		"$(ratio "${p50[$mode]}" "${p50[off]}")" "$(ratio "${p95[$mode]}" "${p95[off]}")"
done
