#!/usr/bin/env bash
# Streaming benchmark: remora's streaming server against containerd's built-in CRI, in one
# run on the test bed, with crictl as the client:
#   - exec round trip: `crictl exec <id> true`, N sequential, p50/p95 (ms);
#   - M concurrent `crictl exec <id> true`: wall time (ms) for all of them;
#   - port-forward throughput: a 64 MiB file fetched with curl from busybox httpd in the pod
#     through `crictl port-forward`, MiB/s (best of 3).
# Each over SPDY (crictl's default) and WebSocket; containerd 2.3 answers 403 to WebSocket
# streaming, reported as "-". Ratios are containerd / remora (above 1: remora is faster).
#
#   scripts/bench-stream.sh [--n N] [--concurrent M]
#
# The test bed must be up (scripts/testbed.sh up). Only this script's pods (namespace
# bench-stream) are touched. Numbers are reported, never asserted; not part of scripts/test.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n=50 m=20
while [[ $# -gt 0 ]]; do
	case $1 in
	--n)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--n needs a positive number"
		n=$2
		shift 2
		;;
	--concurrent)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--concurrent needs a positive number"
		m=$2
		shift 2
		;;
	*) die "unknown argument $1 (usage: $0 [--n N] [--concurrent M])" ;;
	esac
done
command -v curl >/dev/null || die "curl is needed (apt-get install curl)"

CRICTL="$TOOLS_BIN/crictl"
crictl_rt() { "$CRICTL" --config "$TB_ROOT/crictl-$1.yaml" "${@:2}"; }
for rt in remora containerd; do
	crictl_rt "$rt" --timeout 5s version >/dev/null 2>&1 ||
		die "$rt does not answer; is the test bed up? (scripts/testbed.sh up)"
done

work=$(mktemp -d)
pf_pid=
cleanup() {
	[[ -n $pf_pid ]] && kill "$pf_pid" 2>/dev/null
	for rt in remora containerd; do
		for p in $(crictl_rt "$rt" pods -q --namespace bench-stream 2>/dev/null); do
			crictl_rt "$rt" stopp "$p" >/dev/null 2>&1 || true
			crictl_rt "$rt" rmp "$p" >/dev/null 2>&1 || true
		done
	done
	rm -rf "$work"
}
trap cleanup EXIT

percentile() { sort -n | awk -v p="$1" '{a[NR] = $1} END {i = int((NR * p + 99) / 100); if (i < 1) i = 1; print a[i]}'; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

declare -A p50 p95 conc mibs
for rt in remora containerd; do
	cat >"$work/$rt-pod.json" <<JSON
{"metadata": {"name": "bench-stream-$rt", "namespace": "bench-stream", "uid": "bench-stream-$rt"}, "log_directory": "$work/logs-$rt", "linux": {}}
JSON
	cat >"$work/$rt-ctr.json" <<JSON
{"metadata": {"name": "web"}, "image": {"image": "busybox"}, "command": ["sh", "-c", "mkdir -p /www && dd if=/dev/urandom of=/www/big bs=1M count=64 2>/dev/null && touch /www/ready && httpd -f -p 8080 -h /www"], "log_path": "web.log", "linux": {}}
JSON
	crictl_rt "$rt" pull busybox >/dev/null
	pod=$(crictl_rt "$rt" runp "$work/$rt-pod.json")
	ctr=$(crictl_rt "$rt" create "$pod" "$work/$rt-ctr.json" "$work/$rt-pod.json")
	crictl_rt "$rt" start "$ctr" >/dev/null
	for _ in $(seq 100); do
		crictl_rt "$rt" exec -s "$ctr" test -e /www/ready >/dev/null 2>&1 && break
		sleep 0.2
	done
	for tr in spdy websocket; do
		key="$rt/$tr"
		if ! crictl_rt "$rt" exec --transport "$tr" "$ctr" true >/dev/null 2>&1; then
			info "$rt: exec over $tr does not work; reported as -"
			p50[$key]=- p95[$key]=- conc[$key]=- mibs[$key]=-
			continue
		fi
		: >"$work/lat"
		for ((i = 0; i < n; i++)); do
			t0=$(date +%s%N)
			crictl_rt "$rt" exec --transport "$tr" "$ctr" true >/dev/null
			ms_since "$t0" >>"$work/lat"
		done
		p50[$key]=$(percentile 50 <"$work/lat")
		p95[$key]=$(percentile 95 <"$work/lat")
		t0=$(date +%s%N)
		for ((i = 0; i < m; i++)); do crictl_rt "$rt" exec --transport "$tr" "$ctr" true >/dev/null & done
		wait
		conc[$key]=$(ms_since "$t0")

		port=$(free_port)
		crictl_rt "$rt" port-forward --transport "$tr" "$pod" "$port:8080" >/dev/null 2>&1 &
		pf_pid=$!
		for _ in $(seq 100); do
			curl -s -o /dev/null "http://127.0.0.1:$port/ready" && break
			sleep 0.1
		done
		best=0
		for _ in 1 2 3; do
			speed=$(curl -s -o /dev/null -w '%{speed_download}' "http://127.0.0.1:$port/big" || echo 0)
			best=$(echo "$speed $best" | awk '{ print ($1 > $2) ? $1 : $2 }')
		done
		mibs[$key]=$(echo "$best" | awk '{ printf "%.0f", $1 / 1048576 }')
		kill "$pf_pid" 2>/dev/null || true
		wait "$pf_pid" 2>/dev/null || true
		pf_pid=
	done
	crictl_rt "$rt" stopp "$pod" >/dev/null
	crictl_rt "$rt" rmp "$pod" >/dev/null
done

ratio() { echo "$1 $2" | awk '{ if ($1 > 0 && $2 > 0) printf "%.2fx", $2 / $1; else print "-" }'; }
inv_ratio() { echo "$1 $2" | awk '{ if ($1 > 0 && $2 > 0) printf "%.2fx", $1 / $2; else print "-" }'; }
row() { printf '%-44s %10s %12s %12s\n' "$1" "$2" "$3" "$4"; }
echo "streaming: exec round trip ($n sequential), $m concurrent execs, port-forward of 64 MiB"
row "" remora containerd "ctrd/remora"
for tr in spdy websocket; do
	r=remora/$tr c=containerd/$tr
	row "$tr: exec p50 (ms)" "${p50[$r]}" "${p50[$c]}" "$(ratio "${p50[$r]}" "${p50[$c]}")"
	row "$tr: exec p95 (ms)" "${p95[$r]}" "${p95[$c]}" "$(ratio "${p95[$r]}" "${p95[$c]}")"
	row "$tr: $m concurrent execs, wall (ms)" "${conc[$r]}" "${conc[$c]}" "$(ratio "${conc[$r]}" "${conc[$c]}")"
	row "$tr: port-forward (MiB/s; ratio remora/ctrd)" "${mibs[$r]}" "${mibs[$c]}" "$(inv_ratio "${mibs[$r]}" "${mibs[$c]}")"
done
