#!/usr/bin/env bash
# Runs Kubernetes' node e2e suite (test/e2e_node of k8s.io/kubernetes at the kubelet version
# setup.sh pins) on the test bed, against remora or the test bed containerd's own CRI, and
# prints one line per test, sorted, as scripts/critest.sh does:
#   PASS <name> | FAIL <name> | SKIP <name>
# followed by `node-e2e: N passed, N failed, N skipped`.
#
# The suite starts its own services in its own process (an etcd, an API server, a namespace
# controller) and a kubelet (setup.sh's, from beside e2e_node.test) pointed at the runtime;
# the test bed's registry serves every image a test names, under its upstream name.
#
# usage: scripts/node-e2e.sh [--runtime remora|containerd] [--focus REGEX] [--skip REGEX]
#                            [--procs N] [--check FILE] [--only FILE]
#   --runtime R  the CRI to test (default remora); remora runs its default handler
#                (testbed.sh: REMORA_IT_HANDLER)
#   --focus RE   tests to run (default: '\[NodeConformance\]')
#   --skip RE    tests not to run, besides the default skips below
#   --procs N    parallel ginkgo processes (default 12; upstream's node e2e jobs run 8 on
#                2-CPU machines)
#   --check FILE fail unless every test named in FILE (one a line, # comments) passed
#   --only FILE  run only the tests FILE names (a focus made of their names) and check them:
#                the test command's quick subset (integration/node-e2e-quick.txt)
#
# Always skipped: [Flaky], [Slow], [Serial], [Disruptive] and [Feature:...] tests (as
# upstream's NodeConformance jobs), and the tests integration/node-e2e-skips.txt names, each
# with its reason (what this machine lacks).
#
# Exit status: 0 when the suite ran (and the --check list passed), 1 when the --check list did
# not pass, 2 when the suite could not run or timed out.
# Output: $TB_ROOT/logs/node-e2e-<runtime>.log, the ginkgo report .json, the list .results,
# the suite's own report directory (kubelet's log among it) node-e2e-<runtime>/.
# The test bed must be up (scripts/testbed.sh up). Runs kubelet with fixed ports and
# /var/lib/kubelet: one at a time per machine, with the kubelet suite (flock
# /run/remora-kubelet.lock).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

RUN_TIMEOUT=40m
GINKGO_TIMEOUT=38m
DEFAULT_SKIP='\[Flaky\]|\[Slow\]|\[Serial\]|\[Disruptive\]|\[Feature:[^]]+\]'
SKIPS_FILE="$REPO_ROOT/integration/node-e2e-skips.txt"
KUBELET_LOCK=/run/remora-kubelet.lock

runtime=remora
focus='\[NodeConformance\]'
skip=
procs=12
check=
only=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--runtime)
		[[ $# -ge 2 && ($2 == remora || $2 == containerd) ]] || die "--runtime needs remora or containerd"
		runtime=$2
		shift
		;;
	--focus | --skip | --procs | --check | --only)
		[[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"
		case $1 in
		--focus) focus=$2 ;;
		--skip) skip=$2 ;;
		--procs) procs=$2 ;;
		--check) check=$2 ;;
		--only)
			check=$2
			only=1
			;;
		esac
		shift
		;;
	-h | --help)
		sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument: $1 (see --help)" ;;
	esac
	shift
done
[[ $procs =~ ^[1-9][0-9]?$ ]] || die "--procs needs a number from 1 to 99"
if [[ -n "$check" && ! -r "$check" ]]; then
	die "cannot read $check"
fi

# listed FILE: the test names of a list file (whole-line # comments and blank lines dropped).
listed() {
	sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e '/^#/d' -e '/^$/d' "$1"
}
if [[ $only == 1 ]]; then
	# Every regular expression character of the names escaped; one alternative per name.
	focus=$(listed "$check" | sed -e 's#[][\\.*^$+?(){}|/]#\\&#g' | paste -sd '|')
	[[ -n "$focus" ]] || die "$check names no test"
fi

# skip_regex: DEFAULT_SKIP, --skip and every pattern of SKIPS_FILE (lines `REGEX  # reason`).
skip_regex() {
	local re=$DEFAULT_SKIP line pattern
	[[ -n "$skip" ]] && re+="|$skip"
	while IFS= read -r line || [[ -n "$line" ]]; do
		pattern=${line%%#*}
		pattern=${pattern%"${pattern##*[![:space:]]}"}
		[[ -z "$pattern" ]] && continue
		re+="|$pattern"
	done <"$SKIPS_FILE"
	printf '%s' "$re"
}

"$SCRIPTS_DIR/setup.sh" node-e2e

sock=$REMORA_SOCK
[[ $runtime == containerd ]] && sock=$CONTAINERD_SOCK
endpoint="unix://$sock"
if ! crictl --runtime-endpoint "$endpoint" --image-endpoint "$endpoint" --timeout 5s version >/dev/null 2>&1; then
	die "$runtime does not answer on $endpoint; is the test bed up? (scripts/testbed.sh up)"
fi

logs="$TB_ROOT/logs"
log="$logs/node-e2e-$runtime.log"
report="$logs/node-e2e-$runtime.json"
results="$logs/node-e2e-$runtime.results"
report_dir="$logs/node-e2e-$runtime"
# The suite's working directory. The suite writes its kubelet's configuration, kubeconfig and
# static pod directories beside its binary and runs the kubelet it finds there: both are
# linked into $work/bin, so that nothing is written into the tools directory.
work="$TB_RUN/node-e2e"
rm -rf "$report_dir" "$work" "$report"
mkdir -p "$report_dir" "$work/path" "$work/bin"
ln -s "$TOOLS_BIN/e2e_node.test" "$TOOLS_BIN/kubelet" "$work/bin/"

# The suite runs kubelet under `systemd-run` whenever that is on PATH. The test bed has
# systemd installed (the package tests use systemd-analyze) but not running, so the suite
# sees a PATH of links to everything in /usr/bin except systemd-run (/bin is /usr/bin here).
for f in /usr/bin/*; do
	[[ ${f##*/} == systemd-run ]] || ln -s "$f" "$work/path/${f##*/}"
done
suite_path="$TOOLS_BIN:$work/path:/usr/local/sbin:/usr/sbin:/sbin"

# kubelet's base configuration: upstream's default for node e2e jobs
# (test/e2e_node/jenkins/default-kubelet-config.yaml), and cgroup v1 allowed, which kubelet
# 1.35+ refuses unless told (the test bed is cgroup v1).
cat >"$work/kubelet-config.yaml" <<'EOF'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /
podCIDR: "10.100.0.0/24"
volumeStatsAggPeriod: 10s
fileCheckFrequency: 10s
evictionPressureTransitionPeriod: 30s
evictionHard:
  memory.available: 250Mi
  nodefs.available: 10%
  nodefs.inodesFree: 5%
evictionMinimumReclaim:
  nodefs.available: 5%
  nodefs.inodesFree: 5%
serializeImagePulls: false
failCgroupV1: false
EOF

# The mounts under kubelet's root dir (its pods' volumes), left over by a killed run.
clean_kubelet_dirs() {
	local m
	awk '$5 ~ "^/var/lib/kubelet/" {print $5}' /proc/self/mountinfo | sort -r |
		while read -r m; do
			umount -l "$m" 2>/dev/null || true
		done
}
# The suite's kubelet makes /var/lib/kubelet (and bind-mounts it onto itself); put the
# machine back as it was: without them, when they were not there before the run.
is_mount_point() { awk -v d="$1" '$5 == d {found=1} END {exit !found}' /proc/self/mountinfo; }
kubelet_root_existed=0
kubelet_root_mounted=0
record_kubelet_root() {
	[[ -e /var/lib/kubelet ]] && kubelet_root_existed=1
	is_mount_point /var/lib/kubelet && kubelet_root_mounted=1
	return 0
}
restore_kubelet_root() {
	clean_kubelet_dirs
	if [[ $kubelet_root_mounted == 0 ]]; then
		while is_mount_point /var/lib/kubelet; do
			umount -l /var/lib/kubelet || break
		done
	fi
	if [[ $kubelet_root_existed == 0 ]]; then
		rm -rf /var/lib/kubelet
	fi
}

crictl_run() { crictl --config "$TB_ROOT/crictl-$runtime.yaml" --timeout 30s "$@"; }
# kubelet_pods: ids of the runtime's pods that kubelet made (they carry its namespace label).
kubelet_pods() {
	crictl_run pods -o json | jq -r '.items[] | select(.labels["io.kubernetes.pod.namespace"] != null) | .id' | sort
}

exec 9>"$KUBELET_LOCK"
info "waiting for $KUBELET_LOCK (another kubelet run on this machine)"
flock 9
clean_kubelet_dirs
record_kubelet_root
pods_before=$(kubelet_pods)
info "running the node e2e suite against $runtime ($endpoint), $procs processes; output in $log"
rc=0
(
	cd "$work"
	PATH=$suite_path timeout --kill-after=60s "$RUN_TIMEOUT" "$TOOLS_BIN/ginkgo" \
		--procs="$procs" --no-color --timeout="$GINKGO_TIMEOUT" \
		--focus="$focus" --skip="$(skip_regex)" \
		--json-report="$report" \
		"$work/bin/e2e_node.test" -- \
		--container-runtime-endpoint="$endpoint" --image-service-endpoint="$endpoint" \
		--prepull-images=false --node-name="$(hostname)" \
		--report-dir="$report_dir" --kubelet-config-file="$work/kubelet-config.yaml"
) </dev/null >"$log" 2>&1 || rc=$?
# A suite killed at its time limit leaves its kubelet running (known by its kubeconfig).
if pkill -f -- "--kubeconfig $work/bin/kubeconfig"; then
	warn "stopped the kubelet the suite left running"
fi
# The suite stops kubelet at its end; the pods of tests it cut short stay in the runtime.
left=$(comm -13 <(echo "$pods_before") <(kubelet_pods))
if [[ -n "$left" ]]; then
	info "removing $(wc -l <<<"$left") pod(s) the suite left in $runtime"
	# shellcheck disable=SC2086 # one argument per pod id
	crictl_run rmp -f $left >/dev/null || warn "could not remove every pod the suite left"
fi
restore_kubelet_root
flock -u 9
if [[ ! -s "$report" ]]; then
	tail -n 40 "$log" >&2
	die "the node e2e suite produced no report (exit status $rc); see $log"
fi

# One line per test that ran (the skipped ones are the selection's complement).
ginkgo_results "$report" | grep -v '^SKIP ' >"$results" || true

cat "$results"
passed=$(grep -c '^PASS ' "$results" || true)
failed=$(grep -c '^FAIL ' "$results" || true)
skipped=$(jq '[.[].SpecReports[]? | select(.LeafNodeType == "It" and (.State == "skipped" or .State == "pending"))] | length' "$report")
echo "node-e2e ($runtime): $passed passed, $failed failed, $skipped skipped"

if [[ $rc == 124 || $rc == 137 ]] ||
	jq -e '[.[].SpecialSuiteFailureReasons[]? | select(test("[Tt]imeout"))] | length > 0' "$report" >/dev/null; then
	warn "the suite hit its ${RUN_TIMEOUT} time limit; unfinished tests count as FAIL"
	exit 2
fi
if [[ $((passed + failed)) == 0 ]]; then
	warn "the suite ran no test; see $log"
	exit 2
fi

if [[ -n "$check" ]]; then
	check_ratchet "$results" "$check" test || exit 1
fi
exit 0
