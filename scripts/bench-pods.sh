#!/usr/bin/env bash
# Pod start latency and memory benchmark, remora vs the test bed containerd's built-in CRI, in
# one run on the same test bed: RunPodSandbox + CreateContainer + StartContainer (crictl) for
# N pods one after another and M at once, per-pod latency p50/p95; and the daemon's RSS growth
# with the N pods up (remora's own RSS vs containerd's, which hosts its CRI in-process).
#
#   scripts/bench-pods.sh [--n N] [--concurrent M]
#
# Numbers are reported, never asserted. remora runs its release build.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n=20 m=10
while [[ $# -gt 0 ]]; do
	case $1 in
	--n) n=$2; shift 2 ;;
	--concurrent) m=$2; shift 2 ;;
	*) die "unknown argument $1" ;;
	esac
done

up_release_remora
CRICTL="$TOOLS_BIN/crictl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

crictl_rt() { "$CRICTL" --config "$TB_ROOT/crictl-$1.yaml" "${@:2}"; }

# one_pod RUNTIME NAME: runs a pod with one busybox container; prints its latency in ms.
one_pod() {
	local rt=$1 name=$2 start end pod ctr
	cat >"$work/$name-pod.json" <<JSON
{"metadata": {"name": "$name", "namespace": "bench", "uid": "$name-uid"}, "log_directory": "$work/logs/$name", "linux": {}}
JSON
	cat >"$work/$name-ctr.json" <<JSON
{"metadata": {"name": "c"}, "image": {"image": "busybox"}, "command": ["sleep", "3600"], "log_path": "c.log", "linux": {}}
JSON
	start=$(date +%s%N)
	pod=$(crictl_rt "$rt" runp "$work/$name-pod.json" 2>/dev/null)
	ctr=$(crictl_rt "$rt" create "$pod" "$work/$name-ctr.json" "$work/$name-pod.json" 2>/dev/null)
	crictl_rt "$rt" start "$ctr" >/dev/null 2>&1
	end=$(date +%s%N)
	echo $(((end - start) / 1000000))
}

percentile() { sort -n | awk -v p="$1" '{a[NR] = $1} END {i = int((NR * p + 99) / 100); if (i < 1) i = 1; print a[i]}'; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

declare -A seq50 seq95 con50 con95 rss_growth
for rt in remora containerd; do
	crictl_rt "$rt" rmp -af >/dev/null 2>&1 || true
	crictl_rt "$rt" pull busybox >/dev/null 2>&1
	pid=$(cat "$TB_RUN/$rt.pid")
	rss_before=$(rss_kb "$pid")
	: >"$work/$rt-seq"
	for ((i = 0; i < n; i++)); do one_pod "$rt" "$rt-s$i" >>"$work/$rt-seq"; done
	rss_after=$(rss_kb "$pid")
	rss_growth[$rt]=$((rss_after - rss_before))
	crictl_rt "$rt" rmp -af >/dev/null 2>&1
	: >"$work/$rt-con"
	for ((i = 0; i < m; i++)); do one_pod "$rt" "$rt-c$i" >>"$work/$rt-con" & done
	wait
	crictl_rt "$rt" rmp -af >/dev/null 2>&1
	seq50[$rt]=$(percentile 50 <"$work/$rt-seq")
	seq95[$rt]=$(percentile 95 <"$work/$rt-seq")
	con50[$rt]=$(percentile 50 <"$work/$rt-con")
	con95[$rt]=$(percentile 95 <"$work/$rt-con")
done
remora_rss=$(rss_kb "$(cat "$TB_RUN/remora.pid")")

ratio() { echo "$1 $2" | awk '{ if ($1 > 0) printf "%.2fx", $2 / $1; else print "-" }'; }
row() { printf '%-40s %10s %12s %10s\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }
echo "pod start (runp + create + start, crictl): $n sequential, $m concurrent; busybox sleep"
printf '%-40s %10s %12s %10s\n' "" remora containerd "ctrd/remora"
row "sequential p50 (ms)" "${seq50[remora]}" "${seq50[containerd]}"
row "sequential p95 (ms)" "${seq95[remora]}" "${seq95[containerd]}"
row "$m concurrent p50 (ms)" "${con50[remora]}" "${con50[containerd]}"
row "$m concurrent p95 (ms)" "${con95[remora]}" "${con95[containerd]}"
row "daemon RSS growth with $n pods (KiB)" "${rss_growth[remora]}" "${rss_growth[containerd]}"
echo "remora RSS now: ${remora_rss} KiB"
