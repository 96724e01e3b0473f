#!/usr/bin/env bash
# Builds remora's Debian package with cargo-deb (installed by setup.sh):
#   remora                      cargo build --release
#   containerd-shim-remora-v2   cargo build --profile shim -p remora-shim, static (musl; common.sh
#                               build_shim)
#   /etc/remora/config.toml     `remora config default` of the remora just built, so the
#                               shipped config is the code's defaults and cannot drift
#   /etc/apparmor.d/remora-default
#                               `remora apparmor profile`: the default AppArmor profile, the
#                               same text remora loads itself when the kernel lacks it
# plus the files of scripts/package/ and the docs listed in Cargo.toml's
# [package.metadata.deb]. Prints the .deb's path on stdout.
#
#   scripts/package.sh          build target/debian/remora_<version>-1_<arch>.deb
#   REMORA_DEB_REVISION=N scripts/package.sh   the same with Debian revision N (a second
#                               version of the same build, for the node VM's upgrade check)
#   REMORA_DEB_OUT=DIR          write the package to DIR instead of target/debian (cargo-deb
#                               deletes the package's other versions in target/debian, even
#                               when it writes elsewhere: build the one to keep last)
#
# scripts/package-test.sh checks the result.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

command -v cargo-deb >/dev/null || die "cargo-deb not found: run scripts/setup.sh"

# The target directory honours CARGO_TARGET_DIR and .cargo/config.
target=$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
[[ -n "$target" && "$target" != null ]] || die "cargo metadata gave no target directory"

info "cargo build --locked --release --bin remora"
cargo build --locked --release --bin remora
# Its own package (crates/remora-shim, none of the daemon's dependencies), built with the small
# shim profile (`cargo deb` would build every binary with one profile), static for musl.
info "cargo build --locked --profile shim -p remora-shim --target $SHIM_TARGET"
shim=$(build_shim)

# cargo-deb resolves asset paths starting with target/release/ into the real target dir:
# stage there what is not a release-profile binary.
staging="$target/release/deb-staging"
rm -rf "$staging"
mkdir -p "$staging"
cp "$shim" "$staging/"
"$target/release/remora" config default >"$staging/config.toml"
# What we ship must be what remora accepts.
"$target/release/remora" config check --config "$staging/config.toml" >/dev/null ||
	die "remora config check rejects the generated default config"
"$target/release/remora" apparmor profile >"$staging/remora-default"

revision=${REMORA_DEB_REVISION:-1}
[[ $revision =~ ^[0-9]+$ ]] || die "REMORA_DEB_REVISION must be a number (got $revision)"
info "cargo deb --no-build --deb-revision $revision"
out=${REMORA_DEB_OUT:-$target/debian}
mkdir -p "$out"
# cargo-deb prints the path of the package it wrote.
deb=$(cargo deb --no-build --locked --deb-revision "$revision" --output "$out" | tail -n 1)
[[ -f "$deb" ]] || die "cargo deb did not report a package file (got: $deb)"
info "built $deb ($(stat -c %s "$deb") bytes)"
echo "$deb"
