#!/usr/bin/env bash
# Runs every test of remora: lint gates, unit tests, integration tests against the real test
# bed (containerd, registry, CNI) and the critest ratchet. This is the README's test command
# and what CI runs. It also builds the Debian package and checks it (scripts/package-test.sh).
#
#   scripts/test.sh            everything
#   scripts/test.sh --no-lint  skip cargo fmt / clippy / shellcheck (quicker local loop)
#
# The suite (with a quick subset of Kubernetes' node e2e suite, scripts/node-e2e.sh; the kubelet
# suite beside the node VM, which shares nothing with it) runs first with the handler remora
# ships as its default, remora's shim; then a real node: the package on a Debian 12 VM with
# systemd, cgroup v2 and AppArmor (scripts/node-test.sh); then a kubeadm cluster on remora and
# its smoke pass (scripts/cluster.sh). Then once more with the runtime
# handler runc, containerd's Go shim (REMORA_IT_HANDLER=runc: the integration tests but the
# kubelet suite, and the critest ratchet), and critest against containerd's own CRI with
# remora's shim. REMORA_TEST_GO_SHIM=0 skips these last three passes.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

# Each step of this script says how long the run has taken so far, so a slow phase shows in the
# log of any run (CI keeps only the log).
info() { printf '%s: [%dm%02ds] %s\n' "${0##*/}" $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

# Phases: each `phase NAME` ends the one before; the table of their times is printed at the
# end of every run, passed or failed (issue 28 asked where the test command's time goes).
phase_name="" phase_start=0
phase_table=()
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
phase_end() {
	[[ -n "$phase_name" ]] || return 0
	phase_table+=("$(printf '%8s  %s' "$(mmss $((SECONDS - phase_start)))" "$phase_name")")
	phase_name=""
}
phase() {
	phase_end
	phase_name=$1 phase_start=$SECONDS
	info "$1"
}
phase_report() {
	local rc=$?
	phase_end
	printf '%s: phase times (%s; exit %d)\n' "${0##*/}" "$(mmss "$SECONDS")" "$rc" >&2
	printf '  %s\n' "${phase_table[@]}" >&2
}

lint=1
[[ "${1:-}" == "--no-lint" ]] && lint=0

trap phase_report EXIT
phase "setup (scripts/setup.sh)"
"$SCRIPTS_DIR/setup.sh"

# What the build and the test bed have taken, printed where a run fails for want of disk.
disk_report() {
	local target
	target=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | jq -r .target_directory) || target=target
	info "disk: $(df -h --output=avail "$REPO_ROOT" | tail -n 1 | tr -d ' ') free; target $(du -sh "$target" 2>/dev/null | cut -f1)"
}
trap 'phase_report; disk_report' EXIT
disk_report

if [[ $lint == 1 ]]; then
	phase "lint: cargo fmt --check, cargo clippy --workspace -- -D warnings, import circles, shellcheck"
	cargo fmt --all -- --check
	cargo clippy --locked --workspace --all-targets -- -D warnings
	# No module of the daemon imports, through others, one that imports it (the report
	# names each circle's edges and the items that make them).
	python3 scripts/import_circles.py src
	# The shim runs once per pod, so it links none of the daemon's network stack: a new
	# dependency that brings one in fails here (the crate boundary already keeps it from
	# using the daemon's code).
	if cargo tree --locked -p remora-shim -e normal --prefix none |
		grep -E '^(tonic|hyper|reqwest|rustls|prost) '; then
		die "remora-shim links the daemon's dependencies above (cargo tree -p remora-shim -e normal)"
	fi
	# The core (crates/remora-core) compiles without gRPC: the adapters' protocol stacks stay in
	# the daemon, so a dependency that brings one in fails here.
	if cargo tree --locked -p remora-core -e normal --prefix none |
		grep -E '^(tonic|hyper|reqwest|prost) '; then
		die "remora-core links gRPC or HTTP above (cargo tree -p remora-core -e normal)"
	fi
	# -x follows the `source` lines (common.sh); the scripts carry their own directives.
	shellcheck -x scripts/*.sh scripts/node/*.sh .ci/run
fi

# The Debian package: built (remora with the release profile, the shim with its own) and
# checked unpacked into a temporary directory, never installed; needs no test bed.
phase "Debian package (scripts/package-test.sh)"
"$SCRIPTS_DIR/package-test.sh"

# The test bed (and remora on it, rebuilt if its source changed) must be up for the
# integration tests that use its registry and for critest.
phase "test bed up (scripts/testbed.sh up)"
"$SCRIPTS_DIR/testbed.sh" up

phase "cargo test: the workspace's unit tests, the integration tests"
cargo test --locked --workspace --lib --bins -- --test-threads=4
# remora-nri against NRI's Go plugin library (setup.sh built the plugin): a missing binary fails.
REMORA_REQUIRE_TOOLS=1 cargo test --locked -p remora-nri --test launched_logger
cargo test --locked -p remora --test integration -- --test-threads=4
# The kubelet suite (integration/kubelet.rs) runs beside the node VM below: most of its five
# minutes is waiting for kubelet's once-a-minute container GC, and the VM shares nothing with
# it (its own kernel, containerd and kubelet; only the registry). Built now, run from its file
# so that no cargo lock is held while the VM's package build runs.
kubelet_suite=$(cargo test --locked -p remora --test kubelet --no-run --message-format=json |
	jq -r 'select(.target.name == "kubelet" and .executable != null) | .executable')
[[ -x "$kubelet_suite" ]] || die "cargo built no kubelet suite binary (got '$kubelet_suite')"

phase "critest against remora (ratchet: integration/critest-expected-pass.txt)"
"$SCRIPTS_DIR/critest.sh" --check integration/critest-expected-pass.txt

# The streaming specs once more over WebSocket (the run above uses SPDY): their own ratchet.
phase "critest streaming specs over WebSocket against remora (ratchet: integration/critest-expected-pass-websocket.txt)"
"$SCRIPTS_DIR/critest.sh" --websocket --focus Streaming --check integration/critest-expected-pass-websocket.txt

# Kubernetes' node e2e suite (test/e2e_node, [NodeConformance]) against remora: the quick
# subset, the tests that took at most 30 s on containerd's CRI; the whole run is
# `scripts/node-e2e.sh --check integration/node-e2e-expected-pass.txt` (docs/conformance.md).
phase "node e2e suite against remora, the quick subset (ratchet: integration/node-e2e-quick.txt)"
"$SCRIPTS_DIR/node-e2e.sh" --runtime remora --only integration/node-e2e-quick.txt

# A real node: remora's package on a stock Debian 12 VM (systemd, cgroup v2, AppArmor) under
# qemu, with kubelet's systemd cgroup driver; the node's checks and critest's AppArmor, OOM and
# stats specs against their ratchet (integration/critest-node-expected-pass.txt).
phase "the node VM (scripts/node-test.sh) and, beside it, the kubelet suite"
kubelet_log=$(mktemp)
"$kubelet_suite" --test-threads=4 >"$kubelet_log" 2>&1 &
kubelet_pid=$!
vm_rc=0
{ "$SCRIPTS_DIR/setup.sh" node-image && "$SCRIPTS_DIR/node-test.sh"; } || vm_rc=$?
# Whatever the VM did, the suite finishes (it restores the host state it changed).
kubelet_rc=0
wait "$kubelet_pid" || kubelet_rc=$?
info "the kubelet suite (integration/kubelet.rs; exit $kubelet_rc):"
cat "$kubelet_log" >&2
rm -f "$kubelet_log"
((vm_rc == 0)) || die "the node VM test failed (exit $vm_rc)"
((kubelet_rc == 0)) || die "the kubelet suite failed (exit $kubelet_rc)"

# A cluster: kubeadm init with remora as the node's CRI (the control plane as static pods on
# remora), kube-proxy and CoreDNS, then the smoke pass a user would make (a Deployment rolled
# to another image, a Service by name, kubectl exec/logs -f/attach/port-forward/cp, a Job, a
# DaemonSet, a drain), then kubeadm reset, with nothing left behind. After the kubelet suite:
# both run kubelet on this host (/run/remora-kubelet.lock). About 2 minutes here; Kubernetes'
# conformance suite on the same cluster is `scripts/cluster.sh conformance` (hours, not here).
phase "a kubeadm cluster on remora: up, smoke, down (scripts/cluster.sh)"
cluster_rc=0
# A cluster a killed run left would stop `up`.
"$SCRIPTS_DIR/cluster.sh" down
{ REMORA_BIN="$(cargo_target_dir)/debug/remora" "$SCRIPTS_DIR/cluster.sh" up --runtime remora &&
	"$SCRIPTS_DIR/cluster.sh" smoke; } || cluster_rc=$?
"$SCRIPTS_DIR/cluster.sh" down
"$SCRIPTS_DIR/cluster.sh" check-clean
((cluster_rc == 0)) || die "the cluster smoke pass failed (exit $cluster_rc; logs in $TB_ROOT/cluster/logs)"

# A node moved from containerd's CRI to remora as docs/kubeadm.md §4 says: a cluster made on
# containerd's CRI with a Deployment running, cordoned, drained, kubelet switched to remora,
# uncordoned; every pod then runs on remora, and exec, logs and cluster DNS work. About a minute.
phase "a kubeadm node moved from containerd's CRI to remora (scripts/cluster.sh migrate)"
migrate_rc=0
{ "$SCRIPTS_DIR/cluster.sh" up --runtime containerd &&
	REMORA_BIN="$(cargo_target_dir)/debug/remora" "$SCRIPTS_DIR/cluster.sh" migrate; } || migrate_rc=$?
"$SCRIPTS_DIR/cluster.sh" down
"$SCRIPTS_DIR/cluster.sh" check-clean
((migrate_rc == 0)) || die "the move from containerd's CRI to remora failed (exit $migrate_rc; logs in $TB_ROOT/cluster/logs)"

if [[ "${REMORA_TEST_GO_SHIM:-1}" == 0 ]]; then
	phase_end
	info "REMORA_TEST_GO_SHIM=0: skipping the passes with containerd's Go shim"
	exit 0
fi

phase "integration tests with containerd's Go shim (REMORA_IT_HANDLER=runc; the kubelet suite ran above)"
REMORA_IT_HANDLER=runc cargo test --locked --test integration -- --test-threads=4 --skip kubelet::

phase "critest against remora with containerd's Go shim (handler runc, same ratchet)"
"$SCRIPTS_DIR/critest.sh" --handler runc --check integration/critest-expected-pass.txt

# containerd's CRI with remora's shim: the shim under a CRI that is not remora's, held to the
# same ratchet (every spec remora passes passed there too when this was written).
phase "critest against containerd's CRI with remora's shim (same ratchet)"
# Less the specs containerd's CRI itself does not pass (whatever the shim): the image digest in
# ContainerStatus mounts (it never fills ImageSpec.image_ref), the pod metrics listing (no
# container_threads on cgroup v1), and the two NRI specs that hold a late plugin's Synchronize
# for 2 s (containerd's NRI drops it at its 2 s request timeout, and critest skips them).
containerd_ratchet=$(mktemp)
grep -v -e 'should return image digest in ContainerStatus mounts' \
	-e 'should support listing pod sandbox metrics' \
	-e 'should receive a callback for container created during the Synchronize call' \
	-e 'without the race condition during initialization' \
	integration/critest-expected-pass.txt >"$containerd_ratchet"
"$SCRIPTS_DIR/critest.sh" --containerd --handler remora --check "$containerd_ratchet"
rm -f "$containerd_ratchet"

phase_end
info "every step passed"
