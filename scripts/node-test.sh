#!/usr/bin/env bash
# remora on a real (virtual) Kubernetes node: builds the Debian package, boots a fresh stock
# Debian 12 VM (scripts/node-vm.sh), installs containerd and the package as an operator would
# (scripts/node-install.sh, with kubelet's systemd cgroup driver), checks what differs on a
# real node (scripts/node/checks.sh: systemd scopes, cgroup v2 stats and OOM, AppArmor, a
# remora restart under systemd), runs kubelet there as kubeadm configures it, standalone with
# static pods (scripts/node/kubelet.sh), runs critest's AppArmor, OOM and stats specs there
# against their ratchet (integration/critest-node-expected-pass.txt), upgrades the package in
# place while a pod runs (scripts/node/upgrade.sh), purges the package and checks
# nothing stayed behind, then powers the VM off. Whatever fails, the VM is powered off and its
# overlay removed.
#
#   scripts/node-test.sh        needs setup.sh's tools and the test bed's registry
#                               (scripts/testbed.sh up); prints each phase's time
#
# Environment:
#   REMORA_NODE_DEB   a remora .deb to test instead of building one (it must be in
#                     node-vm.sh's debs share: REMORA_NODE_DEB_DIR, default target/debian)
#   REMORA_NODE_KEEP  1: leave the VM up at the end (for a look inside: node-vm.sh ssh)
#   and node-vm.sh's (REMORA_VM_ACCEL, REMORA_NODE_BOOT_TIMEOUT, ...).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NODE_VM="$SCRIPTS_DIR/node-vm.sh"
# What the smoke check runs: images the test bed's registry serves (critest's busybox).
SMOKE_IMAGE=registry.k8s.io/e2e-test-images/busybox:1.36.1-1
# critest's specs that a real node exercises differently from the host bed: AppArmor (the
# bed's kernel has none), OOM and stats (cgroup v2, systemd scopes). Their ratchet is
# integration/critest-node-expected-pass.txt.
NODE_CRITEST_FOCUS='AppArmor|Container OOM|stats'
NODE_CRITEST_TIMEOUT=15m
# The Debian revision of the package the upgrade phase installs over the first (revision 1).
UPGRADE_REVISION=2
# Per VM (REMORA_NODE_STATE): two node tests at once must not share a critest report.
NODE_LOGS="$TB_ROOT/logs/node${REMORA_NODE_STATE:+-${REMORA_NODE_STATE##*/}}"
mkdir -p "$NODE_LOGS"

PHASES=()
# The phase under way, for the summary when it fails.
CURRENT_PHASE='' PHASE_START=0
# phase NAME CMD...: runs CMD and records how long it took.
phase() {
	CURRENT_PHASE=$1 PHASE_START=$SECONDS
	shift
	info "---- $CURRENT_PHASE"
	"$@"
	PHASES+=("$(printf '%-10s %4d s' "$CURRENT_PHASE" $((SECONDS - PHASE_START)))")
	CURRENT_PHASE=
}

print_timings() {
	local p
	((${#PHASES[@]})) || return 0
	info "phase timings:"
	for p in "${PHASES[@]}"; do info "  $p"; done
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	[[ -n "$CURRENT_PHASE" ]] &&
		PHASES+=("$(printf '%-10s %4d s  FAILED' "$CURRENT_PHASE" $((SECONDS - PHASE_START)))")
	if [[ "${REMORA_NODE_KEEP:-0}" == 1 ]]; then
		info "REMORA_NODE_KEEP=1: the node VM stays up (scripts/node-vm.sh down when done)"
	else
		phase down "$NODE_VM" down || rc=1
	fi
	print_timings
	if ((rc == 0)); then info "node test passed"; else info "node test FAILED (status $rc)"; fi
	exit "$rc"
}

build_package() {
	# The upgrade's later version first: the same build with the next Debian revision, built
	# apart and put beside the first in the guest's debs share at the end (cargo-deb deletes
	# the package's other versions in target/debian whenever it builds one).
	local built
	built=$(REMORA_DEB_REVISION=$UPGRADE_REVISION REMORA_DEB_OUT="$NODE_LOGS/upgrade-deb" \
		"$SCRIPTS_DIR/package.sh")
	if [[ -n "${REMORA_NODE_DEB:-}" ]]; then
		DEB=$REMORA_NODE_DEB
	else
		DEB=$("$SCRIPTS_DIR/package.sh")
	fi
	[[ -f "$DEB" ]] || die "no package file $DEB"
	UPGRADE_DEB="$(dirname "$DEB")/$(basename "$built")"
	[[ "$UPGRADE_DEB" != "$DEB" ]] || die "the upgrade package is the installed one ($DEB)"
	cp "$built" "$UPGRADE_DEB"
}

# upgrade: scripts/node/upgrade.sh in the guest (dpkg -i of the later version while a pod runs).
upgrade() {
	"$NODE_VM" ssh -- "bash -s -- $(printf '%q ' "$SMOKE_IMAGE" "$(basename "$UPGRADE_DEB")")" \
		<"$SCRIPTS_DIR/node/upgrade.sh"
}

# checks: scripts/node/checks.sh in the guest (pods under systemd, cgroup v2, AppArmor, OOM,
# stats, a remora restart).
checks() {
	"$NODE_VM" ssh -- "bash -s -- $(printf '%q' "$SMOKE_IMAGE")" <"$SCRIPTS_DIR/node/checks.sh"
}

# kubelet_checks: scripts/node/kubelet.sh in the guest (kubelet as kubeadm configures it, standalone,
# with static pods: probes, emptyDir, kubepods.slice, AppArmor, OOM, user namespaces, a remora
# restart under kubelet); it leaves no pod and kubelet stopped.
kubelet_checks() {
	"$NODE_VM" ssh -- bash -s <"$SCRIPTS_DIR/node/kubelet.sh"
}

# node_critest: critest's specs of what differs on a real node, run in the guest against
# remora; its report is checked on the host against the node's ratchet.
node_critest() {
	local report="$NODE_LOGS/critest-node.json"
	rm -f "$report"
	# critest exits non-zero when a spec fails: the ratchet decides.
	"$NODE_VM" ssh -- "timeout --kill-after=30s $NODE_CRITEST_TIMEOUT /mnt/tools/bin/critest \
		-runtime-endpoint=unix:///run/remora/remora.sock -image-endpoint=unix:///run/remora/remora.sock \
		-ginkgo.focus=$(printf '%q' "$NODE_CRITEST_FOCUS") -ginkgo.no-color -ginkgo.json-report=/root/critest.json \
		>/root/critest.log 2>&1" || true
	"$NODE_VM" scp node:/root/critest.json "$report" ||
		{ "$NODE_VM" ssh -- tail -n 40 /root/critest.log >&2 || true; die "critest wrote no report in the node VM"; }
	"$NODE_VM" scp node:/root/critest.log "$NODE_LOGS/critest-node.log" || true
	"$SCRIPTS_DIR/critest.sh" --from-report "$report" --focus "$NODE_CRITEST_FOCUS" \
		--check "$REPO_ROOT/integration/critest-node-expected-pass.txt"
}

# remove: pods removed, then the package purged; nothing of remora may stay behind (its
# AppArmor profile unloaded too: scripts/package/postrm).
remove() {
	"$NODE_VM" ssh -- bash -s <<'GUEST'
set -euo pipefail
say() { printf 'node: %s\n' "$*" >&2; }
for p in $(crictl pods -q); do crictl stopp "$p" >/dev/null && crictl rmp "$p" >/dev/null; done
dpkg --purge remora >&2
left=()
pgrep -a -f '/usr/bin/(remora|containerd-shim-remora-v2)( |$)' && left+=(processes)
grep -E '/(run|var/lib)/remora' /proc/self/mountinfo && left+=(mounts)
ls /run/netns 2>/dev/null | grep . && left+=("network namespaces")
systemctl list-units --all --no-legend 'remora*' | grep . && left+=(units)
grep '^remora-default ' /sys/kernel/security/apparmor/profiles && left+=("AppArmor profile")
if ((${#left[@]})); then
	say "dpkg --purge remora left behind: ${left[*]}"
	exit 1
fi
say "purged: no remora process, mount, network namespace, unit or AppArmor profile left"
GUEST
}

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

curl -fsS -o /dev/null --max-time 5 "$REGISTRY_URL/v2/" ||
	die "the test bed's registry ($REGISTRY_URL) does not answer: run scripts/testbed.sh up"
phase package build_package
# A VM left over by an earlier run that was killed: start from a fresh one.
"$NODE_VM" down
phase up "$NODE_VM" up
phase install "$SCRIPTS_DIR/node-install.sh" "$DEB"
phase checks checks
phase kubelet kubelet_checks
phase critest node_critest
phase upgrade upgrade
phase remove remove
