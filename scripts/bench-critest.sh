#!/usr/bin/env bash
# critest's own benchmarks (`critest -benchmark`, the pinned cri-tools the test bed builds)
# against remora and the test bed containerd's built-in CRI, in one run on the same test bed:
# container lifecycle (CreateContainer, StartContainer, StatusContainer, StopContainer,
# RemoveContainer), pod lifecycle (CreatePod, StatusPod, StopPod, RemovePod), image
# lifecycle (PullImage, StatusImage, RemoveImage), ListImages, and "create PodSandbox and
# container" (RunPodSandbox + CreateContainer + StartContainer + StopPodSandbox +
# RemovePodSandbox). Prints each operation's mean and median in ms for both runtimes and the
# ratios remora/containerd (below 1.00 is remora faster).
#
#   scripts/bench-critest.sh [--n N] [--rounds R] [--socket PATH]
#
#   --n N       samples per benchmark and runtime per round (default 20), one at a time
#   --rounds R  rounds (default 3); each round runs remora and containerd one after the
#               other, the order alternating between rounds, so that a noisy stretch of a
#               shared machine does not land on one runtime only
#   --socket P  benchmark the remora already serving on unix socket P (e.g. one run with
#               `[log] level = "debug"` for its step timings) instead of the test bed's;
#               nothing is built or restarted
#
# Means are over every sample of every round. remora runs its release build (built here,
# in CARGO_TARGET_DIR if set). Raw data: $TB_ROOT/logs/bench-critest/<runtime>-<round>/.
# Numbers are reported, never asserted; not part of scripts/test.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

n=20 rounds=3 socket=
while [[ $# -gt 0 ]]; do
	case $1 in
	--n | --rounds)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive number"
		[[ $1 == --n ]] && n=$2 || rounds=$2
		shift 2
		;;
	--socket)
		[[ $# -ge 2 && -S $2 ]] || die "--socket needs a unix socket"
		socket=$2
		shift 2
		;;
	-h | --help)
		sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done

if [[ -n "$socket" ]]; then
	REMORA_SOCK=$socket
else
	up_release_remora
fi
[[ -x "$TOOLS_BIN/critest" ]] || die "$TOOLS_BIN/critest is missing; run scripts/setup.sh"

out="$TB_ROOT/logs/bench-critest"
rm -rf "$out"
mkdir -p "$out"
# The image benchmarks pull, inspect and remove these (and remove the listing images after
# listing them): test images no other benchmark runs containers from.
params="$out/params.yaml"
cat >"$params" <<EOF
containersNumber: $n
containersNumberParallel: 1
containerBenchmarkTimeoutSeconds: 120
podsNumber: $n
podsNumberParallel: 1
podBenchmarkTimeoutSeconds: 120
imagesNumber: $n
imagesNumberParallel: 1
imageBenchmarkTimeoutSeconds: 120
imagePullingBenchmarkImage: gcr.io/k8s-staging-cri-tools/test-image-tag:test
imageListingBenchmarkImages:
  - gcr.io/k8s-staging-cri-tools/test-image-1:latest
  - gcr.io/k8s-staging-cri-tools/test-image-2:latest
  - gcr.io/k8s-staging-cri-tools/test-image-3:latest
podContainerStartBenchmarkTimeoutSeconds: 60
EOF

# run_bench RUNTIME ROUND: one critest -benchmark run; data in $out/RUNTIME-ROUND.
run_bench() {
	local rt=$1 round=$2 sock=$REMORA_SOCK dir
	[[ $rt == containerd ]] && sock=$CONTAINERD_SOCK
	dir="$out/$rt-$round"
	mkdir -p "$dir"
	info "round $round: critest -benchmark against $rt ($n samples each)"
	if ! timeout --kill-after=30s 30m "$TOOLS_BIN/critest" -benchmark \
		"-runtime-endpoint=unix://$sock" "-image-endpoint=unix://$sock" \
		"-benchmarking-params-file=$params" "-benchmarking-output-dir=$dir" \
		"-ginkgo.json-report=$dir/report.json" -ginkgo.no-color \
		</dev/null >"$dir/critest.log" 2>&1; then
		tail -n 30 "$dir/critest.log" >&2
		die "critest -benchmark failed against $rt (log: $dir/critest.log)"
	fi
}

for ((r = 1; r <= rounds; r++)); do
	if ((r % 2)); then order=(remora containerd); else order=(containerd remora); fi
	for rt in "${order[@]}"; do run_bench "$rt" "$r"; done
done

# samples RUNTIME: "<operation> <ms>" lines, one per sample, of every round.
samples() {
	local rt=$1 f
	for f in "$out/$rt"-*/*_benchmark_data.json; do
		jq -r '.operationsNames as $ops | .datapoints[]
			| .operationsDurationsNs | to_entries[]
			| "\($ops[.key]) \(.value / 1e6)"' "$f"
	done
	# gmeasure's experiment of the pod-and-container spec, from ginkgo's report (durations
	# in ns).
	for f in "$out/$rt"-*/report.json; do
		jq -r '.[].SpecReports[]?.ReportEntries[]?
			| select(.Name == "start-container-benchmark") | .Value.AsJSON | fromjson
			| .Measurements[] | select(.Type == "Duration") | .Durations[]
			| "PodAndContainer \(. / 1e6)"' "$f"
	done
}

# Each operation's mean, median and sample count. The median as well as critest's mean: on a
# shared machine one stalled sample (a 250 ms CreateContainer among 13 ms ones) moves the
# mean of 60 by 4 ms.
declare -A mean median count
for rt in remora containerd; do
	while read -r op m md c; do
		mean[$rt.$op]=$m
		median[$rt.$op]=$md
		count[$rt.$op]=$c
	done < <(samples "$rt" | sort -k1,1 -k2,2g | awk '
		function flush() {
			if (n == 0) return
			md = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
			printf "%s %.2f %.2f %d\n", op, s / n, md, n
		}
		$1 != op { flush(); op = $1; n = 0; s = 0 }
		{ v[++n] = $2; s += $2 }
		END { flush() }')
done

# ratio A B: "A/B x", or "-" when either is missing.
ratio() {
	awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'
}

ops=(CreatePod StatusPod StopPod RemovePod CreateContainer StartContainer StatusContainer
	StopContainer RemoveContainer PullImage StatusImage RemoveImage ListImages PodAndContainer)
echo "critest -benchmark, $rounds round(s) x $n samples, remora (release) vs containerd $(containerd --version | awk '{print $3}') CRI; ms"
printf '%-16s %17s %7s %17s %7s %8s\n' operation "mean r / c" ratio "median r / c" ratio samples
for op in "${ops[@]}"; do
	a=${mean[remora.$op]:-} b=${mean[containerd.$op]:-}
	ma=${median[remora.$op]:-} mb=${median[containerd.$op]:-}
	[[ -z "$a" && -z "$b" ]] && continue
	printf '%-16s %17s %7s %17s %7s %8s\n' "$op" "${a:--} / ${b:--}" "$(ratio "$a" "$b")" \
		"${ma:--} / ${mb:--}" "$(ratio "$ma" "$mb")" \
		"${count[remora.$op]:-0}/${count[containerd.$op]:-0}"
done
echo "(ratio: remora/containerd, below 1.00x is remora faster)"
echo "(PodAndContainer: critest's \"create PodSandbox and container\", runp + create + start + stopp + rmp)"
