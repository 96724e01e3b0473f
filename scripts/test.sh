#!/usr/bin/env bash
# Runs every test of remora: lint gates, unit tests, integration tests against the real test
# bed (containerd, registry, CNI) and the critest ratchet. This is the README's test command
# and what CI runs. It also builds the Debian package and checks it (scripts/package-test.sh).
#
#   scripts/test.sh            everything
#   scripts/test.sh --no-lint  skip cargo fmt / clippy / shellcheck (quicker local loop)
#
# The suite (with a quick subset of Kubernetes' node e2e suite, scripts/node-e2e.sh) runs first
# with the runtime handler runc (containerd's Go shim), then once more
# with remora's shim (REMORA_IT_HANDLER=remora: the integration tests but the kubelet suite,
# and the critest ratchet), and critest against containerd's own CRI with remora's shim.
# Then a real node: the package on a Debian 12 VM with systemd, cgroup v2 and AppArmor
# (scripts/node-test.sh). REMORA_TEST_SHIM=0 skips the shim passes (while the shim is being
# finished).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

# Each step of this script says how long the run has taken so far, so a slow phase shows in the
# log of any run (CI keeps only the log).
info() { printf '%s: [%dm%02ds] %s\n' "${0##*/}" $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

lint=1
[[ "${1:-}" == "--no-lint" ]] && lint=0

"$SCRIPTS_DIR/setup.sh"

# What the build and the test bed have taken, printed where a run fails for want of disk.
disk_report() {
	local target
	target=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | jq -r .target_directory) || target=target
	info "disk: $(df -h --output=avail "$REPO_ROOT" | tail -n 1 | tr -d ' ') free; target $(du -sh "$target" 2>/dev/null | cut -f1)"
}
trap disk_report EXIT
disk_report

if [[ $lint == 1 ]]; then
	info "cargo fmt --check"
	cargo fmt --all -- --check
	info "cargo clippy -- -D warnings"
	cargo clippy --locked --all-targets -- -D warnings
	info "cargo clippy --no-default-features (the shim alone) -- -D warnings"
	cargo clippy --locked --no-default-features --all-targets -- -D warnings
	info "shellcheck scripts/*.sh scripts/node/*.sh .ci/run"
	# -x follows the `source` lines (common.sh); the scripts carry their own directives.
	shellcheck -x scripts/*.sh scripts/node/*.sh .ci/run
fi

# The Debian package: built (remora with the release profile, the shim with its own) and
# checked unpacked into a temporary directory, never installed; needs no test bed.
info "Debian package (scripts/package-test.sh)"
"$SCRIPTS_DIR/package-test.sh"

# The test bed (and remora on it, rebuilt if its source changed) must be up for the
# integration tests that use its registry and for critest.
"$SCRIPTS_DIR/testbed.sh" up

info "cargo test (unit and integration)"
cargo test --locked -- --test-threads=4

info "critest against remora (ratchet: integration/critest-expected-pass.txt)"
"$SCRIPTS_DIR/critest.sh" --check integration/critest-expected-pass.txt

# The streaming specs once more over WebSocket (the run above uses SPDY): their own ratchet.
info "critest streaming specs over WebSocket against remora (ratchet: integration/critest-expected-pass-websocket.txt)"
"$SCRIPTS_DIR/critest.sh" --websocket --focus Streaming --check integration/critest-expected-pass-websocket.txt

# Kubernetes' node e2e suite (test/e2e_node, [NodeConformance]) against remora: the quick
# subset, the tests that took at most 30 s on containerd's CRI; the whole run is
# `scripts/node-e2e.sh --check integration/node-e2e-expected-pass.txt` (docs/conformance.md).
info "node e2e suite against remora, the quick subset (ratchet: integration/node-e2e-quick.txt)"
"$SCRIPTS_DIR/node-e2e.sh" --runtime remora --only integration/node-e2e-quick.txt

# A real node: remora's package on a stock Debian 12 VM (systemd, cgroup v2, AppArmor) under
# qemu, with kubelet's systemd cgroup driver; the node's checks and critest's AppArmor, OOM and
# stats specs against their ratchet (integration/critest-node-expected-pass.txt).
info "the node VM (scripts/node-test.sh)"
"$SCRIPTS_DIR/setup.sh" node-image
"$SCRIPTS_DIR/node-test.sh"

if [[ "${REMORA_TEST_SHIM:-1}" == 0 ]]; then
	info "REMORA_TEST_SHIM=0: skipping the passes with remora's shim"
	exit 0
fi

info "integration tests with remora's shim (REMORA_IT_HANDLER=remora; the kubelet suite ran above)"
REMORA_IT_HANDLER=remora cargo test --locked --test integration -- --test-threads=4 --skip kubelet::

info "critest against remora with remora's shim (same ratchet)"
"$SCRIPTS_DIR/critest.sh" --handler remora --check integration/critest-expected-pass.txt

# containerd's CRI with remora's shim: the shim under a CRI that is not remora's, held to the
# same ratchet (every spec remora passes passed there too when this was written).
info "critest against containerd's CRI with remora's shim (same ratchet)"
# Less the specs containerd's CRI itself does not pass (whatever the shim): the image digest in
# ContainerStatus mounts (it never fills ImageSpec.image_ref) and the pod metrics listing
# (no container_threads on cgroup v1).
containerd_ratchet=$(mktemp)
grep -v -e 'should return image digest in ContainerStatus mounts' \
	-e 'should support listing pod sandbox metrics' \
	integration/critest-expected-pass.txt >"$containerd_ratchet"
"$SCRIPTS_DIR/critest.sh" --containerd --handler remora --check "$containerd_ratchet"
rm -f "$containerd_ratchet"

info "every step passed"
