#!/usr/bin/env bash
# Checks remora's Debian package without installing it on the host:
#   - control fields (dpkg-deb -I): name, version, architecture, Depends on libc, Recommends
#     containerd, the conffiles, the systemd maintainer scripts;
#   - the files and their modes, after `dpkg-deb -x` into a throw-away root: exactly the
#     expected list, nothing missing, nothing extra;
#   - the packaged remora runs: `remora config check` accepts the shipped config, which is
#     byte for byte `remora config default`; the shipped AppArmor profile is byte for byte
#     `remora apparmor profile`, and apparmor_parser (where installed) parses it; the
#     packaged shim answers -v; the postinst loads the profile;
#   - `systemd-analyze verify` accepts remora.service (see below for how), and the unit says
#     what the design needs (Type=notify, KillMode=process, Delegate=yes, ...);
#   - containerd 2.x (setup.sh's) merges the shipped drop-in into its CRI runtimes, under
#     main configs of version 2, 3 and 4, keeping the main config's own runtimes;
#   - crictl.yaml points at the socket the shipped config serves on.
# Needs no running systemd, no test bed and no network.
#
#   scripts/package-test.sh [DEB]   (no DEB: scripts/package.sh builds one)
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

deb=${1:-}
if [[ -z "$deb" ]]; then
	deb=$("$SCRIPTS_DIR/package.sh")
fi
[[ -f "$deb" ]] || die "no package file $deb"
# An argument relative to the caller's directory, before leaving it.
deb=$(realpath "$deb")
cd "$REPO_ROOT"

failures=0
fail() {
	printf '%s: FAIL: %s\n' "${0##*/}" "$*" >&2
	failures=$((failures + 1))
}
pass() { info "ok: $*"; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root"

# ---- control fields ------------------------------------------------------------------
version=$(cargo metadata --format-version 1 --no-deps | jq -r '.packages[] | select(.name == "remora") | .version')
field() { dpkg-deb -f "$deb" "$1"; }
[[ "$(field Package)" == remora ]] || fail "Package is '$(field Package)', not remora"
[[ "$(field Version)" == "$version"-* ]] || fail "Version '$(field Version)' is not $version-<revision>"
[[ "$(field Architecture)" == "$(dpkg --print-architecture)" ]] || fail "Architecture is '$(field Architecture)'"
[[ "$(field Depends)" == *libc6* ]] || fail "Depends '$(field Depends)' does not name libc6"
[[ "$(field Recommends)" == *"containerd (>= 2.0) | containerd.io (>= 2.0)"* ]] ||
	fail "Recommends '$(field Recommends)' does not name containerd 2.x"
[[ -n "$(field Maintainer)" && -n "$(field Description)" ]] || fail "Maintainer or Description is empty"
dpkg-deb -e "$deb" "$work/control"
conffiles=$(sort "$work/control/conffiles" 2>/dev/null || true)
want_conffiles=$(printf '%s\n' /etc/apparmor.d/remora-default /etc/containerd/conf.d/remora.toml /etc/remora/config.toml)
[[ "$conffiles" == "$want_conffiles" ]] || fail "conffiles are [$conffiles], want [$want_conffiles]"
for script in postinst prerm postrm; do
	grep -q 'remora.service' "$work/control/$script" 2>/dev/null ||
		fail "maintainer script $script does not handle remora.service"
done
grep -q 'deb-systemd-helper' "$work/control/postinst" 2>/dev/null || fail "postinst does not enable the unit"
# The profile is loaded before the unit's snippet (re)starts remora, and that snippet is
# there once (cargo-deb puts it wherever the token appears, comments included).
load_at=$(grep -nF 'apparmor_parser -r' "$work/control/postinst" 2>/dev/null | head -n 1 | cut -d: -f1)
start_at=$(grep -nF 'deb-systemd-invoke' "$work/control/postinst" 2>/dev/null | head -n 1 | cut -d: -f1)
if [[ -z "$load_at" ]]; then
	fail "postinst does not load the AppArmor profile"
elif [[ -z "$start_at" || "$load_at" -gt "$start_at" ]]; then
	fail "postinst does not load the AppArmor profile before it starts remora (lines $load_at, $start_at)"
fi
[[ "$(grep -c 'deb-systemd-invoke' "$work/control/postinst" 2>/dev/null)" == 1 ]] ||
	fail "postinst runs the unit's start snippet more than once"
grep -q '#DEBHELPER#' "$work/control/postinst" 2>/dev/null && fail "postinst still has its #DEBHELPER# token"
pass "control fields, conffiles and maintainer scripts"

# ---- files and modes ----------------------------------------------------------------
dpkg-deb -x "$deb" "$root"
# systemd's unit directory for packages: /lib on Debian 12 (merged /usr), or /usr/lib.
unit=$(cd "$root" && find . -path '*/systemd/system/remora.service' -printf '%P\n')
[[ "$unit" == lib/systemd/system/remora.service || "$unit" == usr/lib/systemd/system/remora.service ]] ||
	fail "remora.service is at '$unit'"
expected=$(
	sort <<EOF_FILES
0644 etc/apparmor.d/remora-default
0644 etc/containerd/conf.d/remora.toml
0644 etc/remora/config.toml
0644 ${unit:-lib/systemd/system/remora.service}
0755 usr/bin/containerd-shim-remora-v2
0755 usr/bin/remora
0644 usr/share/doc/remora/README.md
0644 usr/share/doc/remora/config.md
0644 usr/share/doc/remora/copyright
0644 usr/share/doc/remora/examples/crictl.yaml
0644 usr/share/doc/remora/kubelet.md
0644 usr/share/doc/remora/operating.md
EOF_FILES
)
actual=$(cd "$root" && find . ! -type d -printf '%#m %P\n' | sed 's/^0*\([0-7]\{3\}\) /0\1 /' | sort)
owners=$(dpkg-deb -c "$deb" | awk '{print $2}' | sort -u)
if [[ "$actual" != "$expected" ]]; then
	fail "package files differ from the expected list:"
	diff <(echo "$expected") <(echo "$actual") >&2 || true
# dpkg-deb -c shows owners by name or, when the archive stores ids only, as 0/0.
elif [[ "$owners" != root/root && "$owners" != 0/0 ]]; then
	fail "files not owned by root/root: $owners"
else
	pass "$(wc -l <<<"$expected") files with the expected modes, owned by root"
fi

# ---- the binaries and the shipped config ----------------------------------------------
remora="$root/usr/bin/remora"
config="$root/etc/remora/config.toml"
if out=$("$remora" config check --config "$config" 2>&1); then
	pass "remora config check accepts the shipped config"
else
	fail "remora config check rejects the shipped config: $out"
fi
if cmp -s <("$remora" config default) "$config"; then
	pass "the shipped config is remora config default"
else
	fail "the shipped config differs from \`remora config default\`:"
	diff <("$remora" config default) "$config" >&2 || true
fi
profile="$root/etc/apparmor.d/remora-default"
if cmp -s <("$remora" apparmor profile) "$profile"; then
	pass "the shipped AppArmor profile is remora apparmor profile"
else
	fail "the shipped AppArmor profile differs from \`remora apparmor profile\`:"
	diff <("$remora" apparmor profile) "$profile" >&2 || true
fi
# Parse and compile only (-Q: no kernel load, -K: no cache), against the host's includes.
if ! command -v apparmor_parser >/dev/null; then
	fail "apparmor_parser not found (Debian package apparmor; scripts/setup.sh installs it)"
elif out=$(apparmor_parser -Q -K "$profile" 2>&1); then
	pass "apparmor_parser accepts the shipped profile"
else
	fail "apparmor_parser rejects the shipped profile: $out"
fi
[[ "$("$remora" --version)" == "remora $version" ]] || fail "remora --version says '$("$remora" --version)'"
shim_out=$("$root/usr/bin/containerd-shim-remora-v2" -v 2>&1) || fail "containerd-shim-remora-v2 -v failed: $shim_out"
[[ "$shim_out" == *"Version: $version"* ]] || fail "containerd-shim-remora-v2 -v says '$shim_out'"

# ---- the systemd unit -----------------------------------------------------------------
unit_file="$root/${unit:-lib/systemd/system/remora.service}"
for directive in 'Type=notify' 'KillMode=process' 'Delegate=yes' 'Requires=containerd.service' \
	'ExecStart=/usr/bin/remora --config /etc/remora/config.toml'; do
	grep -qxF "$directive" "$unit_file" || fail "remora.service lacks '$directive'"
done
grep -qE '^After=.*\bcontainerd\.service\b' "$unit_file" || fail "remora.service is not After=containerd.service"
grep -qE '^LimitNOFILE=[0-9]+$' "$unit_file" || fail "remora.service sets no LimitNOFILE"
# systemd-analyze verify checks that ExecStart's binary exists and is executable, on the
# host's file system. Rather than install anything there, verify a copy of the unit whose
# ExecStart names the unpacked binary (the rest of the unit is unchanged). `--root` would
# also resolve the binary inside the unpacked tree, but then finds none of the units the
# unit refers to (containerd.service, multi-user.target), which live on the host.
# verify exits 0 on warnings (an unknown key, say): any output counts as a failure.
if command -v systemd-analyze >/dev/null; then
	sed "s#^ExecStart=/usr/bin/remora #ExecStart=$remora #" "$unit_file" >"$work/remora.service"
	if out=$(systemd-analyze verify "$work/remora.service" 2>&1) && [[ -z "$out" ]]; then
		pass "systemd-analyze verify accepts remora.service"
	else
		fail "systemd-analyze verify: $out"
	fi
else
	fail "systemd-analyze not found (Debian package systemd; scripts/setup.sh installs it)"
fi

# ---- the containerd drop-in -----------------------------------------------------------
containerd_bin="$TOOLS_BIN/containerd"
if [[ -x "$containerd_bin" ]]; then
	failed_before=$failures
	for v in 2 3 4; do
		main="$work/containerd-v$v.toml"
		{
			echo "version = $v"
			echo "imports = [\"$root/etc/containerd/conf.d/*.toml\"]"
			# The main config's own runtime must survive the merge.
			if [[ $v == 2 ]]; then
				echo '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]'
			else
				echo '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]'
			fi
			echo '  SystemdCgroup = true'
		} >"$main"
		if ! dump=$("$containerd_bin" --config "$main" config dump 2>"$work/dump.err"); then
			fail "containerd refuses the drop-in under a version $v main config: $(cat "$work/dump.err")"
			continue
		fi
		remora_table=$(awk '/runtimes\.remora\]$/ {on = 1} /runtimes\.runc\]$/ {on = 0} on' <<<"$dump")
		if ! grep -qF "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.remora]" <<<"$remora_table" ||
			! grep -qF "runtime_type = 'io.containerd.remora.v2'" <<<"$remora_table" ||
			! grep -qF "BinaryName = 'runc'" <<<"$remora_table"; then
			fail "containerd (main config version $v) has no runtime remora of type io.containerd.remora.v2"
		fi
		grep -qF 'SystemdCgroup = true' <<<"$dump" ||
			fail "the drop-in replaced the main config's runc options (version $v)"
	done
	[[ $failures == "$failed_before" ]] &&
		pass "containerd $("$containerd_bin" --version | awk '{print $3}') registers runtime remora from the drop-in (main config versions 2, 3, 4)"
else
	fail "containerd not found at $containerd_bin (scripts/setup.sh builds it)"
fi

# ---- crictl.yaml ----------------------------------------------------------------------
socket=$(sed -n 's/^socket = "\(.*\)"$/\1/p' "$config")
crictl="$root/usr/share/doc/remora/examples/crictl.yaml"
for key in runtime-endpoint image-endpoint; do
	grep -qxF "$key: unix://$socket" "$crictl" || fail "crictl.yaml's $key is not unix://$socket"
done

if [[ $failures -gt 0 ]]; then
	die "$failures check(s) failed for $deb"
fi
info "package checks passed: $deb ($(stat -c %s "$deb") bytes)"
