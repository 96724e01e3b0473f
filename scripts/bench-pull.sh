#!/usr/bin/env bash
# Pull coalescing benchmark, remora vs the test bed containerd's built-in CRI, in one run on
# the same test bed: N concurrent PullImage (crictl) of a fresh, never-seen multi-layer image,
# then N concurrent pulls of the same, now present, tag (at once, and again after remora's
# digest cache TTL). For each runtime it counts the
# registry's requests from its access log (manifest GET/HEAD, blob GETs, and the most GETs of
# any one blob) and times the whole burst. Prints a table and containerd/remora ratios.
#
#   scripts/bench-pull.sh [--n N] [--layers L] [--layer-kb KB] [--rounds R]
#
# Each runtime pulls its own fresh image (same shape) so neither finds the other's content.
# Wall times are medians over R rounds (default 3); request counts are from the last round.
# Nothing here is a pass/fail assertion: it reports numbers.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n=20 layers=5 layer_kb=2048 rounds=3
while [[ $# -gt 0 ]]; do
	case $1 in
	--n) n=$2; shift 2 ;;
	--layers) layers=$2; shift 2 ;;
	--layer-kb) layer_kb=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	*) die "unknown argument $1" ;;
	esac
done

# Benchmarks run the optimised build: the test bed restarts remora when its binary changes.
up_release_remora
REG_LOG="$TB_ROOT/logs/registry.log"
CRICTL="$TOOLS_BIN/crictl"

# burst RUNTIME REF: N concurrent pulls; prints the wall time in seconds; fails if any fails.
burst() {
	local rt=$1 ref=$2 i pids=() start end failed=0
	start=$(date +%s.%N)
	for ((i = 0; i < n; i++)); do
		"$CRICTL" --config "$TB_ROOT/crictl-$rt.yaml" pull "$ref" >/dev/null 2>&1 &
		pids+=($!)
	done
	for i in "${pids[@]}"; do wait "$i" || failed=$((failed + 1)); done
	end=$(date +%s.%N)
	[[ $failed == 0 ]] || die "$failed of $n pulls of $ref against $rt failed"
	awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f\n", e - s }'
}

# count MARK REPO: registry requests for REPO logged after line MARK, as
# "manifest_get manifest_head blob_gets max_per_blob".
count() {
	local mark=$1 repo=$2
	tail -n +"$((mark + 1))" "$REG_LOG" | awk -v repo="/v2/$repo/" '
		/^[0-9.]+ - - \[/ && index($0, repo) {
			split($0, q, "\""); split(q[2], r, " "); method = r[1]; uri = r[2]
			sub(/\?.*/, "", uri)
			if (uri ~ /\/manifests\//) { if (method == "GET") mg++; else if (method == "HEAD") mh++ }
			else if (uri ~ /\/blobs\// && method == "GET") { bg++; per[uri]++ }
		}
		END { m = 0; for (u in per) if (per[u] > m) m = per[u]; printf "%d %d %d %d\n", mg, mh, bg, m }'
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

# remora reuses a tag's resolved digest for [images] digest_cache_ttl (default 10 s): the
# "stale" burst waits that out, so it shows the cost of re-checking a present tag.
ttl_wait=${TTL_WAIT:-11}

declare -A cold_t warm_t stale_t cold_c warm_c stale_c
for rt in remora containerd; do
	cold_times=() warm_times=() stale_times=()
	for ((round = 1; round <= rounds; round++)); do
		repo="bench/$rt-$(date +%s%N)"
		"$SCRIPTS_DIR/images/push_random.py" "$repo" --layers "$layers" --layer-kb "$layer_kb" >/dev/null
		ref="registry.k8s.io/$repo:v1"
		mark=$(wc -l <"$REG_LOG")
		cold_times+=("$(burst "$rt" "$ref")")
		cold_c[$rt]=$(count "$mark" "$repo")
		mark=$(wc -l <"$REG_LOG")
		warm_times+=("$(burst "$rt" "$ref")")
		warm_c[$rt]=$(count "$mark" "$repo")
		sleep "$ttl_wait"
		mark=$(wc -l <"$REG_LOG")
		stale_times+=("$(burst "$rt" "$ref")")
		stale_c[$rt]=$(count "$mark" "$repo")
		"$CRICTL" --config "$TB_ROOT/crictl-$rt.yaml" rmi "$ref" >/dev/null 2>&1 || true
	done
	cold_t[$rt]=$(printf '%s\n' "${cold_times[@]}" | median)
	warm_t[$rt]=$(printf '%s\n' "${warm_times[@]}" | median)
	stale_t[$rt]=$(printf '%s\n' "${stale_times[@]}" | median)
done

ratio() { echo "$1 $2" | awk '{ if ($1 > 0) printf "%.2fx", $2 / $1; else print "-" }'; }
row() { printf '%-34s %12s %12s %10s\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }
read -r r_mg r_mh r_bg r_max <<<"${cold_c[remora]}"
read -r c_mg c_mh c_bg c_max <<<"${cold_c[containerd]}"
read -r rw_mg rw_mh rw_bg _ <<<"${warm_c[remora]}"
read -r cw_mg cw_mh cw_bg _ <<<"${warm_c[containerd]}"
read -r rs_mg rs_mh rs_bg _ <<<"${stale_c[remora]}"
read -r cs_mg cs_mh cs_bg _ <<<"${stale_c[containerd]}"

echo "pull burst: $n concurrent PullImage, fresh image of $layers x $layer_kb KiB gzip layers (+ config), median of $rounds rounds"
printf '%-34s %12s %12s %10s\n' "" remora containerd "ctrd/remora"
row "cold: wall time (s)" "$(printf %.3f "${cold_t[remora]}")" "$(printf %.3f "${cold_t[containerd]}")"
row "cold: manifest GETs" "$r_mg" "$c_mg"
row "cold: manifest HEADs" "$r_mh" "$c_mh"
row "cold: blob GETs (layers + config)" "$r_bg" "$c_bg"
row "cold: most GETs of one blob" "$r_max" "$c_max"
row "warm: wall time (s)" "$(printf %.3f "${warm_t[remora]}")" "$(printf %.3f "${warm_t[containerd]}")"
row "warm: registry requests" "$((rw_mg + rw_mh + rw_bg))" "$((cw_mg + cw_mh + cw_bg))"
row "warm after ${ttl_wait}s: wall time (s)" "$(printf %.3f "${stale_t[remora]}")" "$(printf %.3f "${stale_t[containerd]}")"
row "warm after ${ttl_wait}s: registry requests" "$((rs_mg + rs_mh + rs_bg))" "$((cs_mg + cs_mh + cs_bg))"
