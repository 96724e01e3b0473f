#!/usr/bin/env bash
# Runs every test of remora: lint gates, unit tests, integration tests against the real test
# bed (containerd, registry, CNI) and the critest ratchet. This is the README's test command
# and what CI runs.
#
#   scripts/test.sh            everything
#   scripts/test.sh --no-lint  skip cargo fmt / clippy / shellcheck (quicker local loop)
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

lint=1
[[ "${1:-}" == "--no-lint" ]] && lint=0

"$SCRIPTS_DIR/setup.sh"

if [[ $lint == 1 ]]; then
	info "cargo fmt --check"
	cargo fmt --all -- --check
	info "cargo clippy -- -D warnings"
	cargo clippy --locked --all-targets -- -D warnings
	info "shellcheck scripts/*.sh .ci/run"
	# -x follows the `source` lines (common.sh); the scripts carry their own directives.
	shellcheck -x scripts/*.sh .ci/run
fi

# The test bed (and remora on it, rebuilt if its source changed) must be up for the
# integration tests that use its registry and for critest.
"$SCRIPTS_DIR/testbed.sh" up

info "cargo test (unit and integration)"
cargo test --locked -- --test-threads=4

info "critest against remora (ratchet: integration/critest-expected-pass.txt)"
"$SCRIPTS_DIR/critest.sh" --check integration/critest-expected-pass.txt
