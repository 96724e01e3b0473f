#!/usr/bin/env bash
# Shim benchmark: containerd's Go runc shim against remora's shim, through the test bed's
# remora, one runtime handler after the other: runc (Go shim), remora (remora's shim running
# runc) and crun (remora's shim running crun) when crun is installed. For each handler it
# starts N pods (a pause sandbox and one busybox `sleep` container each; RunPodSandbox +
# CreateContainer + StartContainer through crictl), measures the shims serving them, removes
# the pods, and prints:
#   - shim RSS and PSS per pod (KiB): Rss/Pss of /proc/<pid>/smaps_rollup summed over the
#     shim processes of those pods, divided by N (PSS shares the binary's pages between the
#     shims, so it is what N pods cost together);
#   - pod start latency (ms): runp + create + start, mean per pod, pods started one by one;
# and the ratios remora's shim / Go shim.
#
#   scripts/bench-shim.sh [--n N]
#
# The test bed must be up (scripts/testbed.sh up). Only this script's pods (label
# bench=shim) are touched. Numbers are reported, never asserted; not part of scripts/test.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n=20
while [[ $# -gt 0 ]]; do
	case $1 in
	--n)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--n needs a positive number"
		n=$2
		shift 2
		;;
	*) die "unknown argument $1 (usage: $0 [--n N])" ;;
	esac
done

CRICTL="$TOOLS_BIN/crictl"
crictl_remora() { "$CRICTL" --config "$TB_ROOT/crictl-remora.yaml" "$@"; }
crictl_remora --timeout 5s version >/dev/null 2>&1 ||
	die "remora does not answer on unix://$REMORA_SOCK; is the test bed up? (scripts/testbed.sh up)"

handlers=(runc remora)
if command -v crun >/dev/null; then
	handlers+=(crun)
else
	info "crun is not installed: skipping the crun handler"
fi
[[ -x "$TOOLS_BIN/containerd-shim-remora-v2" ]] ||
	warn "$TOOLS_BIN/containerd-shim-remora-v2 is missing (scripts/setup.sh installs it); the remora handler will fail"

work=$(mktemp -d)
# remove_bench_pods: this script's pods only (never `rmp --all`: the bed is shared).
remove_bench_pods() {
	local ids
	ids=$(crictl_remora pods --label bench=shim -q 2>/dev/null) || return 0
	[[ -z "$ids" ]] && return 0
	# shellcheck disable=SC2086 # one id per word
	crictl_remora stopp $ids >/dev/null 2>&1 || true
	# shellcheck disable=SC2086
	crictl_remora rmp $ids >/dev/null 2>&1 || warn "could not remove every benchmark pod"
}
trap 'remove_bench_pods; rm -rf "$work"' EXIT

# one_pod HANDLER NAME: runs a pod with one busybox container under HANDLER; prints the
# pod's id, the container's id and the latency in ms.
one_pod() {
	local handler=$1 name=$2 start end pod ctr
	mkdir -p "$work/logs/$name"
	cat >"$work/$name-pod.json" <<JSON
{"metadata": {"name": "$name", "namespace": "bench-shim", "uid": "$name-uid"}, "labels": {"bench": "shim"}, "log_directory": "$work/logs/$name", "linux": {}}
JSON
	cat >"$work/$name-ctr.json" <<JSON
{"metadata": {"name": "c"}, "image": {"image": "busybox"}, "command": ["sleep", "3600"], "log_path": "c.log", "linux": {}}
JSON
	start=$(date +%s%N)
	pod=$(crictl_remora runp --runtime "$handler" "$work/$name-pod.json") ||
		die "RunPodSandbox with handler $handler failed"
	ctr=$(crictl_remora create "$pod" "$work/$name-ctr.json" "$work/$name-pod.json") ||
		die "CreateContainer in pod $pod ($handler) failed"
	crictl_remora start "$ctr" >/dev/null || die "StartContainer $ctr ($handler) failed"
	end=$(date +%s%N)
	echo "$pod $ctr $(((end - start) / 1000000))"
}

# shim_pids IDS_FILE: pids of the test bed containerd's shims (either binary) whose -id is
# one of the ids in IDS_FILE (a shim serves a pod under the sandbox's id; a shim per
# container would carry the container's id).
shim_pids() {
	local p args id
	for p in /proc/[0-9]*; do
		args=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
		[[ "$args" == *containerd-shim* && "$args" == *"-address $CONTAINERD_SOCK "* ]] || continue
		id=$(awk '{for (i = 1; i < NF; i++) if ($i == "-id") print $(i + 1)}' <<<"$args")
		[[ -n "$id" ]] && grep -qxF -- "$id" "$1" && echo "${p#/proc/}"
	done
	return 0
}

# smaps_kb FIELD PID...: the sum of FIELD (Rss, Pss) over the pids' smaps_rollup, in KiB.
smaps_kb() {
	local field=$1 pid total=0 v
	shift
	for pid in "$@"; do
		v=$(awk -v f="$field:" '$1 == f {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null) || v=0
		total=$((total + ${v:-0}))
	done
	echo "$total"
}

crictl_remora pull busybox >/dev/null || die "cannot pull busybox through remora"
remove_bench_pods

declare -A rss pss lat nshims
measured=()
for h in "${handlers[@]}"; do
	info "handler $h: starting $n pods"
	: >"$work/$h-ids"
	: >"$work/$h-lat"
	failed=0
	for ((i = 0; i < n; i++)); do
		if ! read -r pod ctr ms < <(one_pod "$h" "shim-$h-$i"); then
			failed=1
			break
		fi
		printf '%s\n%s\n' "$pod" "$ctr" >>"$work/$h-ids"
		echo "$ms" >>"$work/$h-lat"
	done
	if [[ $failed == 1 ]]; then
		# The Go shim and remora's are the comparison; crun may not work on every host
		# (Debian's crun 1.8 refuses hybrid cgroup v1 + v2 hosts): reported, not fatal.
		[[ $h == runc || $h == remora ]] && die "handler $h could not start pods"
		warn "handler $h could not start pods (see the error above): left out"
		remove_bench_pods
		continue
	fi
	measured+=("$h")
	mapfile -t pids < <(shim_pids "$work/$h-ids")
	[[ ${#pids[@]} -gt 0 ]] || die "no shim processes found for the $h pods"
	nshims[$h]=${#pids[@]}
	rss[$h]=$(($(smaps_kb Rss "${pids[@]}") / n))
	pss[$h]=$(($(smaps_kb Pss "${pids[@]}") / n))
	lat[$h]=$(awk '{s += $1} END {printf "%d", s / NR}' "$work/$h-lat")
	info "handler $h: removing its pods"
	remove_bench_pods
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo "shim cost per pod, $n pods (pause + busybox sleep) per handler, through remora"
printf '%-8s %6s %14s %14s %16s\n' handler shims "RSS/pod KiB" "PSS/pod KiB" "start mean ms"
for h in "${measured[@]}"; do
	printf '%-8s %6s %14s %14s %16s\n' "$h" "${nshims[$h]}" "${rss[$h]}" "${pss[$h]}" "${lat[$h]}"
done
for h in "${measured[@]}"; do
	[[ $h == runc ]] && continue
	printf '%s shim / Go shim: RSS %s, PSS %s, start latency %s\n' "$h" \
		"$(ratio "${rss[$h]}" "${rss[runc]}")" "$(ratio "${pss[$h]}" "${pss[runc]}")" \
		"$(ratio "${lat[$h]}" "${lat[runc]}")"
done
