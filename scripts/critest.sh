#!/usr/bin/env bash
# Runs critest (cri-tools' CRI validation suite) against the test bed's remora,
# or with --containerd against the test bed containerd's built-in CRI, and
# prints one line per spec, sorted:
#   PASS <name> | FAIL <name> | SKIP <name>
# followed by the totals line `critest: N passed, N failed, N skipped`.
# <name> is the spec's container texts and leaf text joined by spaces, e.g.
#   [k8s.io] Image Manager public image with tag should be pulled and removed [Conformance]
#
# usage: scripts/critest.sh [--containerd] [--handler NAME] [--websocket]
#                           [--focus REGEX] [--check FILE] [-- CRITEST_ARGS...]
#        scripts/critest.sh --from-report JSON [--focus REGEX] [--check FILE]
#   --containerd  test the test bed containerd's CRI instead of remora
#   --handler H   run the pods with runtime handler H (-runtime-handler), e.g.
#                 remora for remora's shim; default: the runtime's default one
#   --websocket   streaming specs over WebSocket instead of SPDY
#   --focus RE    only specs matching RE (-ginkgo.focus); the others are SKIP
#   --check FILE  fail unless every spec named in FILE (one a line, # comments)
#                 passed; without it, failing specs do not fail the script
#   --from-report JSON  run nothing: list and check the specs of the ginkgo JSON
#                 report critest wrote elsewhere (scripts/node-test.sh: in the
#                 node VM); its list goes beside it as .results
#
# Exit status: 0 when critest ran (and the --check list passed), 1 when the
# --check list did not pass, 2 when critest could not run or timed out.
# Raw output: $TB_ROOT/logs/critest-<target>[-<handler>][-websocket].log, report .json,
# list .results.
# Environment: REMORA_CRITEST  the critest binary to run (default: $TOOLS_BIN/critest), e.g.
#   a newer cri-tools release being tried before setup.sh pins it.
# The test bed must be up (scripts/testbed.sh up).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# The suite takes 10-20 minutes; a hung runtime must not hold CI for longer
# than this. Ginkgo's own timeout is a little shorter so that it can still
# write its report (and mark the unfinished specs) before `timeout` kills it.
RUN_TIMEOUT=40m
GINKGO_TIMEOUT=38m
CRITEST=${REMORA_CRITEST:-$TOOLS_BIN/critest}

target=remora
handler=
websocket=0
focus=
check=
from_report=
extra=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--containerd) target=containerd ;;
	--websocket) websocket=1 ;;
	--handler)
		[[ $# -ge 2 && -n $2 ]] || die "--handler needs a runtime handler name"
		handler=$2
		shift
		;;
	--focus)
		[[ $# -ge 2 ]] || die "--focus needs a regular expression"
		focus=$2
		shift
		;;
	--check)
		[[ $# -ge 2 ]] || die "--check needs a file"
		check=$2
		shift
		;;
	--from-report)
		[[ $# -ge 2 ]] || die "--from-report needs a ginkgo JSON report"
		from_report=$2
		shift
		;;
	--)
		shift
		extra=("$@")
		break
		;;
	-h | --help)
		sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument: $1 (see --help)" ;;
	esac
	shift
done
if [[ -n "$check" && ! -r "$check" ]]; then
	die "cannot read $check"
fi

# run_critest: runs the suite against the test bed; sets report, results and rc (critest's
# exit status).
run_critest() {
	sock=$REMORA_SOCK
	nri_sock=$REMORA_NRI_SOCK
	if [[ $target == containerd ]]; then
		sock=$CONTAINERD_SOCK
		nri_sock=$CONTAINERD_NRI_SOCK
	fi
	endpoint="unix://$sock"
	logs="$TB_ROOT/logs"
	mkdir -p "$logs"
	run_name=$target${handler:+-$handler}
	[[ $websocket == 1 ]] && run_name+=-websocket
	log="$logs/critest-$run_name.log"
	report="$logs/critest-$run_name.json"
	results="$logs/critest-$run_name.results"

	[[ -x "$CRITEST" ]] || die "$CRITEST is missing; run scripts/setup.sh"
	if ! crictl --runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --timeout 5s version >/dev/null 2>&1; then
		die "$target does not answer on $endpoint; is the test bed up? (scripts/testbed.sh up)"
	fi

	args=(
		"-runtime-endpoint=$endpoint"
		"-image-endpoint=$endpoint"
		"-ginkgo.json-report=$report"
		"-ginkgo.no-color"
		"-ginkgo.timeout=$GINKGO_TIMEOUT"
		# critest's NRI specs connect their own plugin there.
		"-nri-socket=$nri_sock"
	)
	if [[ -n "$handler" ]]; then
		args+=("-runtime-handler=$handler")
	fi
	if [[ $websocket == 1 ]]; then
		args+=(-websocket-exec -websocket-attach -websocket-portforward)
	fi
	if [[ -n "$focus" ]]; then
		args+=("-ginkgo.focus=$focus")
	fi
	args+=("${extra[@]}")

	# shm_ids: ids of the host's SysV shared memory segments.
	shm_ids() { ipcs -m 2>/dev/null | awk '$2 ~ /^[0-9]+$/ {print $2}' | sort; }

	info "running critest against $target ($endpoint${handler:+, handler $handler}); output in $log"
	rm -f "$report"
	shm_before=$(shm_ids)
	rc=0
	timeout --kill-after=60s "$RUN_TIMEOUT" "$CRITEST" "${args[@]}" \
		</dev/null >"$log" 2>&1 || rc=$?
	# The HostIpc specs create 1 MiB segments on the host (ipcmk) and never
	# remove them; drop the unattached ones this run created.
	for id in $(comm -13 <(echo "$shm_before") <(shm_ids)); do
		if ipcs -m -i "$id" 2>/dev/null | grep -q 'nattch=0'; then
			ipcrm -m "$id" 2>/dev/null || true
		fi
	done
	# rc is non-zero when any spec failed; only a missing report means critest
	# did not run.
	if [[ ! -s "$report" ]]; then
		tail -n 40 "$log" >&2
		die "critest produced no report (exit status $rc); see $log"
	fi
}

if [[ -n "$from_report" ]]; then
	[[ -s "$from_report" ]] || die "no report at $from_report"
	report=$from_report
	results="${from_report%.json}.results"
	log=$from_report
	rc=0
else
	run_critest
fi

ginkgo_results "$report" >"$results"

cat "$results"
passed=$(grep -c '^PASS ' "$results" || true)
failed=$(grep -c '^FAIL ' "$results" || true)
skipped=$(grep -c '^SKIP ' "$results" || true)
echo "critest: $passed passed, $failed failed, $skipped skipped"

if [[ $rc == 124 || $rc == 137 ]] ||
	jq -e '[.[].SpecialSuiteFailureReasons[]? | select(test("[Tt]imeout"))] | length > 0' "$report" >/dev/null; then
	warn "critest hit its ${RUN_TIMEOUT} time limit; unfinished specs count as FAIL"
	exit 2
fi
if [[ $((passed + failed)) == 0 && -z "$focus" ]]; then
	warn "critest ran no spec; see $log"
	exit 2
fi

if [[ -n "$check" ]]; then
	check_ratchet "$results" "$check" spec || exit 1
fi
exit 0
