#!/usr/bin/env bash
# Installs what the remora test bed needs: Debian packages, containerd and
# cri-tools built from the Go module proxy, the .proto files remora's build
# compiles (protos/sources.txt, from the Go module proxy), and the Debian packages whose
# binaries go into the locally built test images. Idempotent: a second run only
# checks versions and returns in about a second.
#
# It also builds remora's shim (containerd-shim-remora-v2) and installs it into
# the tools' bin directory, beside containerd, whenever the build changed.
#
# Environment: REMORA_TOOLS_DIR (default /var/tmp/remora-tools);
#   REMORA_SHIM_BIN  a shim binary to install instead of building one.
set -euo pipefail

# ---- pinned versions (bump here, nowhere else) ------------------------------
CONTAINERD_VERSION=v2.3.4 # github.com/containerd/containerd/v2
CRI_TOOLS_VERSION=v1.37.0 # sigs.k8s.io/cri-tools (crictl, critest)
KUBELET_VERSION=v1.37.2   # k8s.io/kubernetes (kubelet, for the kubelet suite and the node VM)
RUST_VERSION=1.95.0       # must match rust-toolchain.toml; only checked
# The cluster (scripts/cluster.sh, `setup.sh cluster`): the versions kubeadm v1.37.2 names in
# cmd/kubeadm/app/constants (DefaultEtcdVersion 3.7.0-0, CoreDNSVersion v1.14.6), built from
# the Go module proxy; the Kubernetes binaries come from k8s.io/kubernetes at KUBELET_VERSION.
ETCD_VERSION=v3.7.0     # go.etcd.io/etcd/server/v3, image registry.k8s.io/etcd:3.7.0-0
COREDNS_VERSION=v1.14.6 # github.com/coredns/coredns, image registry.k8s.io/coredns/coredns:v1.14.6
# k8s.io/sample-apiserver for the conformance suite's image e2e-test-images/sample-apiserver:1.29.2.
# Upstream's image carries v0.33.7, which the module proxy does not serve; this is the release
# of the kubelet's minor.
SAMPLE_APISERVER_VERSION=v0.37.2
# The .proto files remora compiles (k8s.io/cri-api) are pinned in protos/sources.txt.
# The newest `go` line of the modules built here: cri-tools v1.37.0 (containerd v2.3.4 asks
# for 1.26.3, k8s.io/kubernetes v1.37.2 for 1.26.0).
GO_MIN_VERSION=1.26.6
CARGO_DEB_VERSION=3.7.0   # crates.io cargo-deb, builds the Debian package (scripts/package.sh)
# github.com/opencontainers/runc, installed as $TOOLS_BIN/runc-pinned (common.sh: PINNED_RUNC) for
# the runc-running handlers of both CRIs on the test bed: Debian's runc 1.1.5 has no idmapped
# mounts, which user-namespaced pods need. Debian's runc stays installed.
RUNC_VERSION=v1.5.3
# Debian bookworm packages unpacked (not installed) into test images. Debian
# replaces security-updated versions in its archive, so a pinned version that
# has vanished falls back to the current candidate with a warning.
DEB_BUSYBOX_VERSION=1:1.35.0-4+deb12u1+b1 # dynamic busybox for e2e images
DEB_NGINX_VERSION=1.22.1-9+deb12u11       # nginx for the web server images
DEB_NETCAT_VERSION=1.219-1                # OpenBSD nc (UDP) for the node e2e suite's agnhost image
# Debian packages installed on the host (bookworm's versions).
APT_PACKAGES=(
	containerd runc containernetworking-plugins docker-registry busybox-static
	protobuf-compiler iproute2 iptables jq curl python3 libc6-dev gcc
	procps util-linux ca-certificates shellcheck crun
	# scripts/package.sh and package-test.sh: dpkg-shlibdeps (cargo-deb's Depends) and
	# systemd-analyze. Installing systemd starts nothing without a running systemd: its
	# maintainer scripts only call systemctl when /run/systemd/system exists.
	dpkg-dev systemd
	# The pinned runc is built with cgo and the seccomp tag (build_runc).
	libseccomp-dev pkg-config
	# apparmor_parser: the unit test and package-test.sh parse remora's default AppArmor
	# profile with it (-Q, no kernel needed). Installing it loads nothing without AppArmor.
	apparmor
	# dig, for the e2e images' DNS probes (agnhost, glibc-dns-testing: upstream's carry
	# bind-tools and dnsutils; the conformance suite's DNS tests run `dig` in them).
	bind9-dnsutils
)
# The node VM (scripts/node-vm.sh): a stock Debian 12 node booted under qemu. Bump
# NODE_IMAGE_VERSION whenever build_node_image changes what it writes; the package list is part
# of the cache key too. `setup.sh node-image` builds it (and nothing else); plain `setup.sh`
# does not.
NODE_IMAGE_VERSION=1
NODE_SUITE=bookworm
# The host's own Debian mirror (/etc/apt/sources.list.d/debian.sources), with security updates.
NODE_MIRROR=http://deb.debian.org/debian
NODE_SECURITY_MIRROR=http://deb.debian.org/debian-security
NODE_HOST_PACKAGES=(qemu-system-x86 qemu-utils mmdebstrap openssh-client e2fsprogs)
# What the guest gets besides the minbase variant (apt, dpkg, coreutils, mount, util-linux).
# containerd, runc and the CNI plugins are not here: scripts/node-install.sh installs them from
# $TOOLS as an operator would install release binaries.
NODE_PACKAGES=(
	systemd-sysv udev dbus linux-image-amd64 initramfs-tools apparmor openssh-server
	iproute2 iptables ca-certificates libseccomp2 mount kmod procps jq
	# critest loads its AppArmor test profiles with `sudo apparmor_parser`.
	sudo
)
# ------------------------------------------------------------------------------

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

LOGS="$TOOLS/logs"
STAMPS="$TOOLS/stamps"
mkdir -p "$TOOLS_BIN" "$LOGS" "$STAMPS"

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0
apt_update_once() {
	if [[ $APT_UPDATED == 0 ]]; then
		info "apt-get update"
		run_logged "$LOGS/apt.log" apt-get update -q
		APT_UPDATED=1
	fi
}

install_apt_packages() {
	local missing=() p
	for p in "${APT_PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			missing+=("$p")
		fi
	done
	[[ ${#missing[@]} == 0 ]] && return 0
	apt_update_once
	info "apt-get install ${missing[*]}"
	run_logged "$LOGS/apt.log" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
}

# version_ge A B: true when dotted version A >= B.
version_ge() {
	[[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

check_go() {
	command -v go >/dev/null || die "Go >= $GO_MIN_VERSION is needed (not found on PATH or in /usr/local/go/bin)"
	local v
	v=$(go env GOVERSION)
	v=${v#go}
	# An older Go would try to download a newer toolchain; say so plainly.
	version_ge "$v" "$GO_MIN_VERSION" || warn "Go $v is older than $GO_MIN_VERSION; relying on GOTOOLCHAIN to fetch a newer one"
}

build_containerd() {
	local want=${CONTAINERD_VERSION#v}
	# `go install` leaves the version as "2.3.4+unknown"; match the number only.
	if [[ -x "$TOOLS_BIN/containerd-shim-runc-v2" && -x "$TOOLS_BIN/ctr" ]] &&
		"$TOOLS_BIN/containerd" --version 2>/dev/null | grep -qE " v?${want//./\\.}([+ ]|$)"; then
		return 0
	fi
	check_go
	info "building containerd $CONTAINERD_VERSION (about 70 s; log: $LOGS/containerd-build.log)"
	local m=github.com/containerd/containerd/v2/cmd
	# no_btrfs: the btrfs snapshotter needs btrfs headers we do not install.
	run_logged "$LOGS/containerd-build.log" \
		env GOBIN="$TOOLS_BIN" go install -tags no_btrfs \
		"$m/containerd@$CONTAINERD_VERSION" \
		"$m/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
		"$m/ctr@$CONTAINERD_VERSION"
	"$TOOLS_BIN/containerd" --version >&2
}

build_cri_tools() {
	local stamp="$STAMPS/cri-tools"
	if [[ -x "$TOOLS_BIN/crictl" && -x "$TOOLS_BIN/critest" && -f "$stamp" &&
		"$(<"$stamp")" == "$CRI_TOOLS_VERSION" ]]; then
		return 0
	fi
	check_go
	local log="$LOGS/cri-tools-build.log" ldflags
	ldflags="-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION"
	info "building crictl and critest $CRI_TOOLS_VERSION (log: $log)"
	rm -f "$stamp"
	run_logged "$log" \
		env GOBIN="$TOOLS_BIN" go install -ldflags "$ldflags" "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS_VERSION"
	# critest is a Ginkgo test binary: `go test -c` from a throwaway module
	# that requires cri-tools, because `go install pkg@version` cannot do it.
	local src="$TOOLS/src/critest-build"
	rm -rf "$src"
	mkdir -p "$src"
	(
		cd "$src"
		run_logged "$log" go mod init remora.invalid/critest-build
		run_logged "$log" go get -t "sigs.k8s.io/cri-tools/cmd/critest@$CRI_TOOLS_VERSION"
		run_logged "$log" go test -c -ldflags "$ldflags" -o "$TOOLS_BIN/critest" sigs.k8s.io/cri-tools/cmd/critest
	)
	echo "$CRI_TOOLS_VERSION" >"$stamp"
}

# nri-stub-logger: remora-nri's test plugin (crates/remora-nri/tests/nri-stub-logger/main.go), on
# NRI's Go plugin library, pkg/stub of github.com/containerd/nri at the version protos/sources.txt
# pins for NRI's api.proto (one pin for both). NRI's own sample plugins (plugins/logger...) cannot
# be built from the Go module proxy: each is a nested module whose go.mod replaces
# github.com/containerd/nri with ../.., and none is published. Built in a throwaway module, as
# critest; rebuilt when the pin or main.go changes (the stamp holds both).
build_nri_stub_logger() {
	local main="$REPO_ROOT/crates/remora-nri/tests/nri-stub-logger/main.go"
	local bin="$TOOLS_BIN/nri-stub-logger" stamp="$STAMPS/nri-stub-logger" version want
	version=$(awk '$1 == "github.com/containerd/nri" { print $2 }' "$REPO_ROOT/protos/sources.txt")
	[[ -n "$version" ]] || die "protos/sources.txt pins no github.com/containerd/nri version"
	want="$version $(sha256sum <"$main" | cut -d' ' -f1)"
	if [[ -x "$bin" && -f "$stamp" && "$(<"$stamp")" == "$want" ]]; then
		return 0
	fi
	check_go
	local log="$LOGS/nri-stub-logger-build.log" src="$TOOLS/src/nri-stub-logger"
	info "building nri-stub-logger on github.com/containerd/nri $version (log: $log)"
	rm -f "$stamp"
	rm -rf "$src"
	mkdir -p "$src"
	cp "$main" "$src/main.go"
	(
		cd "$src"
		run_logged "$log" go mod init remora.invalid/nri-stub-logger
		run_logged "$log" go get "github.com/containerd/nri@$version"
		run_logged "$log" env GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 \
			go build -trimpath -o "$bin.new" .
	)
	mv -f "$bin.new" "$bin"
	rm -rf "$src"
	echo "$want" >"$stamp"
}

# kubelet and the node e2e suite's binaries are built from k8s.io/kubernetes as the Go module
# proxy serves it. Its go.mod replaces every k8s.io/X staging module with ./staging/src/k8s.io/X,
# a directory the proxy's zip lacks; each replace is pointed at the published
# k8s.io/X v0.<minor>.<patch> module instead. One copy of the source serves every binary that
# needs building; each has its own stamp.
#   kubelet         the kubelet suite, the node VM and the node e2e suite (about 2.5 min on
#                   2 cores with a warm Go cache; v1.37.2 took 9 min while other builds shared them)
#   agnhost         test/images/agnhost, for the test bed's agnhost image (a few seconds warm)
#   e2e_node.test   test/e2e_node, and ginkgo (the CLI at the version k8s.io/kubernetes requires),
#                   for scripts/node-e2e.sh only: `setup.sh node-e2e` (4 min warm, about 20 cold)
#   kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy
#                   the cluster of scripts/cluster.sh: `setup.sh cluster`
#   e2e.test        test/e2e (with ginkgo), Kubernetes' conformance suite: `setup.sh cluster-e2e`
k8s_stamped() { # NAME: the binary NAME is built at KUBELET_VERSION
	[[ -x "$TOOLS_BIN/$1" && -f "$STAMPS/$1" && "$(<"$STAMPS/$1")" == "$KUBELET_VERSION" ]] &&
		[[ "$1" != e2e_node.test || -x "$TOOLS_BIN/ginkgo" ]] &&
		[[ "$1" != e2e.test || (-x "$TOOLS_BIN/ginkgo" && -f "$TOOLS/e2e-images/nautilus/data.json") ]] &&
		[[ "$1" != agnhost || -f "$TOOLS/agnhost/localhost.key" ]]
}

build_kubernetes() { # NAME...: kubelet, agnhost, e2e_node.test, the cluster's, e2e.test
	local name todo=()
	for name in "$@"; do
		k8s_stamped "$name" || todo+=("$name")
	done
	((${#todo[@]})) || return 0
	check_go
	local log="$LOGS/kubernetes-build.log" dir src staging
	staging="v0.${KUBELET_VERSION#v1.}"
	info "building ${todo[*]} from k8s.io/kubernetes $KUBELET_VERSION (log: $log)"
	dir=$(cd "$TOOLS" && go mod download -json "k8s.io/kubernetes@$KUBELET_VERSION" | jq -r .Dir)
	[[ -d "$dir" ]] || die "go mod download of k8s.io/kubernetes@$KUBELET_VERSION gave no directory"
	src="$TOOLS/src/kubernetes"
	rm -rf "$src"
	mkdir -p "$TOOLS/src"
	cp -r "$dir" "$src"
	chmod -R u+w "$src"
	sed -i -E "s#^(\s*)(k8s\.io/[A-Za-z0-9._/-]+) => \./staging/src/k8s\.io/[A-Za-z0-9._/-]+#\1\2 => \2 $staging#" "$src/go.mod"
	if grep -q '=> ./staging' "$src/go.mod"; then
		die "kubernetes: go.mod still replaces modules with ./staging after the rewrite"
	fi
	local ldflags="-X k8s.io/component-base/version.gitVersion=$KUBELET_VERSION"
	ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
	ldflags+=" -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$KUBELET_VERSION")"
	local go=(env GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 go)
	for name in "${todo[@]}"; do
		rm -f "$STAMPS/$name"
		(
			cd "$src"
			case "$name" in
			kubelet) run_logged "$log" "${go[@]}" build -ldflags "$ldflags" -o "$TOOLS_BIN/kubelet" ./cmd/kubelet ;;
			agnhost)
				run_logged "$log" "${go[@]}" build -ldflags "-s -w" -o "$TOOLS_BIN/agnhost" ./test/images/agnhost
				# The certificate upstream's image carries for agnhost's TLS servers.
				mkdir -p "$TOOLS/agnhost"
				cp test/images/agnhost/porter/localhost.crt test/images/agnhost/porter/localhost.key "$TOOLS/agnhost/"
				;;
			e2e_node.test)
				# The suite runs kubelet from the directory its binary is in.
				run_logged "$log" "${go[@]}" test -c -ldflags "$ldflags" -o "$TOOLS_BIN/e2e_node.test" ./test/e2e_node
				run_logged "$log" "${go[@]}" build -o "$TOOLS_BIN/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
				;;
			kubeadm | kubectl | kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy)
				run_logged "$log" "${go[@]}" build -ldflags "$ldflags -s -w" -o "$TOOLS_BIN/$name" "./cmd/$name"
				;;
			e2e.test)
				run_logged "$log" "${go[@]}" test -c -ldflags "$ldflags" -o "$TOOLS_BIN/e2e.test" ./test/e2e
				run_logged "$log" "${go[@]}" build -o "$TOOLS_BIN/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
				# The files of upstream's kitten and nautilus images (data.json and a picture), for
				# scripts/images/e2e.json.
				rm -rf "$TOOLS/e2e-images"
				mkdir -p "$TOOLS/e2e-images"
				cp -r test/images/kitten/html "$TOOLS/e2e-images/kitten"
				cp -r test/images/nautilus/html "$TOOLS/e2e-images/nautilus"
				;;
			*) die "build_kubernetes: unknown binary $name" ;;
			esac
		)
		echo "$KUBELET_VERSION" >"$STAMPS/$name"
	done
	rm -rf "$src"
}

# go_module_build NAME MODULE VERSION PKG [REPLACE...]: builds PKG of MODULE@VERSION (a copy of
# the proxy's module, with each REPLACE "module" pointed at the published MODULE's VERSION in
# place of the repository-relative path its go.mod names) as $TOOLS_BIN/NAME, once per VERSION.
go_module_build() {
	local name=$1 module=$2 version=$3 pkg=$4
	shift 4
	local stamp="$STAMPS/$name"
	if [[ -x "$TOOLS_BIN/$name" && -f "$stamp" && "$(<"$stamp")" == "$version" ]]; then
		return 0
	fi
	check_go
	local log="$LOGS/$name-build.log" dir src="$TOOLS/src/$name" r
	info "building $name from $module@$version (log: $log)"
	dir=$(cd "$TOOLS" && go mod download -json "$module@$version" | jq -r .Dir)
	[[ -d "$dir" ]] || die "go mod download of $module@$version gave no directory"
	rm -f "$stamp"
	rm -rf "$src"
	mkdir -p "$TOOLS/src"
	cp -r "$dir" "$src"
	chmod -R u+w "$src"
	for r in "$@"; do
		sed -i -E "s#^(\s*)${r//./\\.} => \.\.?/[A-Za-z0-9._/-]+#\1$r => $r $version#" "$src/go.mod"
	done
	if grep -qE '=> \.\.?/' "$src/go.mod"; then
		die "$module: go.mod still replaces modules with local paths after the rewrite"
	fi
	(
		cd "$src"
		run_logged "$log" env GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 \
			go build -trimpath -ldflags "-s -w" -o "$TOOLS_BIN/$name.new" "$pkg"
	)
	mv -f "$TOOLS_BIN/$name.new" "$TOOLS_BIN/$name"
	rm -rf "$src"
	echo "$version" >"$stamp"
}

# The cluster's binaries (scripts/cluster.sh): Kubernetes' control plane, kubeadm and kubectl,
# etcd and CoreDNS. About 10 minutes on 2 cores with kubelet's Go cache warm.
build_cluster() {
	build_kubernetes kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy
	go_module_build etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" . \
		go.etcd.io/etcd/api/v3 go.etcd.io/etcd/client/pkg/v3 go.etcd.io/etcd/client/v3 go.etcd.io/etcd/pkg/v3
	go_module_build coredns github.com/coredns/coredns "$COREDNS_VERSION" .
}

# runc is built from the Go module proxy's copy of github.com/opencontainers/runc (no replace
# directives, but `go install` cannot set the build tags' ldflags the Makefile sets), in a copy of
# the module with cgo: tags seccomp (libseccomp-dev) and urfave_cli_no_docs, as runc's Makefile,
# without libpathrs (a Rust C library we do not install; runc then uses its pure-Go pathrs-lite).
# Installed as $PINNED_RUNC, not as `runc`: $TOOLS_BIN is first in PATH, and the handlers that
# are not pointed at it keep Debian's /usr/sbin/runc.
build_runc() {
	local want=${RUNC_VERSION#v}
	if [[ -x "$PINNED_RUNC" ]] && "$PINNED_RUNC" --version 2>/dev/null | grep -qx "runc version ${want//./\\.}"; then
		return 0
	fi
	check_go
	local log="$LOGS/runc-build.log" dir src
	info "building runc $RUNC_VERSION (about 45 s; log: $log)"
	dir=$(cd "$TOOLS" && go mod download -json "github.com/opencontainers/runc@$RUNC_VERSION" | jq -r .Dir)
	[[ -d "$dir" ]] || die "go mod download of github.com/opencontainers/runc@$RUNC_VERSION gave no directory"
	src="$TOOLS/src/runc"
	rm -rf "$src"
	mkdir -p "$TOOLS/src"
	cp -r "$dir" "$src"
	chmod -R u+w "$src"
	(
		cd "$src"
		run_logged "$log" env GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=1 \
			go build -trimpath -tags "seccomp urfave_cli_no_docs" \
			-ldflags "-X main.gitCommit=$RUNC_VERSION" -o "$PINNED_RUNC.new" .
	)
	mv -f "$PINNED_RUNC.new" "$PINNED_RUNC"
	rm -rf "$src"
	"$PINNED_RUNC" --version >&2
}

# deb_available PACKAGE VERSION: true when apt can fetch that exact version
# (`apt-cache show pkg=ver` exits 0 even when the version is unknown).
deb_available() {
	apt-cache madison "$1" 2>/dev/null | awk -F' [|] ' '{print $2}' | grep -qxF -- "$2"
}

# fetch_deb PACKAGE VERSION: unpacks the .deb into $TOOLS/debs/PACKAGE (files
# only, nothing installed on the host) for scripts/images/build_push.py.
fetch_deb() {
	local pkg=$1 ver=$2 dest="$TOOLS/debs/$1"
	if [[ -f "$dest/.version" && "$(<"$dest/.version")" == "$ver" ]]; then
		return 0
	fi
	if [[ -f "$dest/.version" && -f "$dest/.pinned" && "$(<"$dest/.pinned")" == "$ver" ]]; then
		return 0 # pinned version was unavailable last time; keep the fallback
	fi
	if ! deb_available "$pkg" "$ver"; then
		apt_update_once
	fi
	local got=$ver
	if ! deb_available "$pkg" "$ver"; then
		got=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
		[[ -n "$got" && "$got" != "(none)" ]] || die "Debian package $pkg is not available"
		warn "$pkg $ver is no longer in the Debian archive; using $got"
	fi
	info "unpacking Debian $pkg $got into $dest"
	local tmp
	tmp=$(mktemp -d)
	# apt drops privileges to _apt for downloads; let it write there.
	chmod 0777 "$tmp"
	(cd "$tmp" && run_logged "$LOGS/apt.log" apt-get download "$pkg=$got")
	rm -rf "$dest"
	mkdir -p "$dest"
	dpkg-deb -x "$tmp"/*.deb "$dest"
	rm -rf "$tmp"
	echo "$got" >"$dest/.version"
	echo "$ver" >"$dest/.pinned"
}

# fetch_protos: the protocol sources remora compiles (protos/sources.txt: module, version, path,
# go.sum hash), downloaded from the Go module proxy and copied to
# $TOOLS/protos/<module>@<version>/<path>, where build.rs looks for them. The module's hash is
# checked against the pinned one (the Go checksum database checks it too, unless GOSUMDB=off).
fetch_protos() {
	local list="$REPO_ROOT/protos/sources.txt" module version path sum rest dest json got dir
	[[ -f "$list" ]] || die "$list is missing"
	while read -r module version path sum rest; do
		[[ -z "$module" || "$module" == "#"* ]] && continue
		[[ -n "$sum" && -z "$rest" ]] || die "$list: expected '<module> <version> <path> <hash>', got: $module $version $path $sum $rest"
		dest="$TOOLS/protos/$module@$version/$path"
		if [[ -f "$dest" && -f "$dest.sum" && "$(<"$dest.sum")" == "$sum" ]]; then
			continue
		fi
		check_go
		info "fetching $path from Go module $module@$version"
		json=$(cd "$TOOLS" && go mod download -json "$module@$version") ||
			die "go mod download $module@$version failed"
		got=$(jq -r .Sum <<<"$json")
		[[ "$got" == "$sum" ]] || die "Go module $module@$version has hash $got, protos/sources.txt pins $sum"
		dir=$(jq -r .Dir <<<"$json")
		[[ -f "$dir/$path" ]] || die "Go module $module@$version has no $path"
		mkdir -p "$(dirname "$dest")"
		install -m 0644 "$dir/$path" "$dest.new"
		mv -f "$dest.new" "$dest"
		echo "$sum" >"$dest.sum"
	done <"$list"
}

check_rust() {
	command -v cargo >/dev/null || die "cargo not found (rustup is expected on these machines)"
	local out
	# From the repo root so that rust-toolchain.toml picks the toolchain.
	out=$(cd "$REPO_ROOT" && cargo --version) || die "cargo --version failed in $REPO_ROOT"
	info "$out"
	[[ "$out" == "cargo $RUST_VERSION "* ]] || warn "expected cargo $RUST_VERSION"
	# rust-toolchain.toml lists the shim's static target, which rustup installs with the
	# toolchain; said here too for a toolchain installed before it was listed. A machine that
	# cannot fetch it still builds the shim, against glibc (common.sh build_shim).
	(cd "$REPO_ROOT" && rustup target list --installed | grep -qx "$SHIM_TARGET") ||
		(cd "$REPO_ROOT" && rustup target add "$SHIM_TARGET") ||
		warn "rustup target add $SHIM_TARGET failed: the shim will be built against glibc"
}

# install_shim: builds remora's shim and installs it as
# $TOOLS_BIN/containerd-shim-remora-v2. containerd resolves runtime type
# io.containerd.remora.v2 to that binary name, looked up in its PATH and in the
# directory of the containerd binary; $TOOLS_BIN is both (testbed.sh and the
# integration harness start containerd from there, with $TOOLS_BIN first in
# PATH). The copy is atomic (a temp file renamed over the old one): running
# shims keep their old binary, the next shim start gets the new one.
install_shim() {
	local bin=${REMORA_SHIM_BIN:-} dest="$TOOLS_BIN/containerd-shim-remora-v2"
	if [[ -z "$bin" ]]; then
		local log="$LOGS/shim-build.log"
		info "cargo build --locked --profile shim -p remora-shim --target $SHIM_TARGET (log: $log)"
		# Its own package (crates/remora-shim): none of the daemon's dependencies.
		bin=$(build_shim 2>"$log") || {
			tail -n 30 "$log" >&2
			die "building the shim failed (log: $log)"
		}
		[[ $bin == */"$SHIM_TARGET"/* ]] || warn "the shim is a glibc build ($bin): see $log"
	fi
	[[ -x "$bin" ]] || die "shim binary $bin is missing or not executable"
	if [[ -x "$dest" ]] && cmp -s "$bin" "$dest"; then
		return 0
	fi
	local tmp
	tmp=$(mktemp "$dest.XXXXXX")
	cp "$bin" "$tmp"
	chmod 0755 "$tmp"
	mv -f "$tmp" "$dest"
	info "installed $dest (from $bin)"
}

# install_cargo_deb: cargo-deb into $TOOLS_BIN (on PATH through common.sh, where
# `cargo deb` finds it), rebuilt only when the pinned version changes.
install_cargo_deb() {
	local bin="$TOOLS_BIN/cargo-deb"
	if [[ -x "$bin" ]] && [[ "$("$bin" --version 2>/dev/null)" == *" $CARGO_DEB_VERSION" ]]; then
		return 0
	fi
	local log="$LOGS/cargo-deb-build.log"
	info "cargo install cargo-deb $CARGO_DEB_VERSION (about 2 min; log: $log)"
	# From the repo root, so that rust-toolchain.toml picks the toolchain.
	(cd "$REPO_ROOT" && run_logged "$log" cargo install --locked --root "$TOOLS" \
		--version "$CARGO_DEB_VERSION" cargo-deb)
}

# build_node_image: the node VM's base image in $NODE_DIR (common.sh): a Debian 12 rootfs
# from the Debian archive (mmdebstrap), written into an ext4 image with mkfs.ext4 -d (no loop
# mount), the kernel and initramfs beside it, an ssh host key and a client key made here.
# Rebuilt when NODE_IMAGE_VERSION or NODE_PACKAGES change. The archive is the live one: what
# it got is recorded in $NODE_DIR/packages.txt and kernel-version.
build_node_image() {
	local stamp="$STAMPS/node-image" want lock
	want="$NODE_IMAGE_VERSION $NODE_SUITE ${NODE_PACKAGES[*]}"
	# Two builds at once would share one build directory: the second waits for the first.
	exec {lock}>"$STAMPS/node-image.lock"
	flock "$lock"
	if [[ -f "$stamp" && "$(<"$stamp")" == "$want" && -f "$NODE_DIR/rootfs.ext4" ]]; then
		return 0
	fi
	local missing=() p
	for p in "${NODE_HOST_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if [[ ${#missing[@]} != 0 ]]; then
		apt_update_once
		info "apt-get install ${missing[*]}"
		run_logged "$LOGS/apt.log" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
	fi
	local log="$LOGS/node-image.log" start=$SECONDS
	info "building the node VM image (Debian $NODE_SUITE, about 2.5 min; log: $log)"
	rm -f "$stamp"
	: >"$log"
	local work="$NODE_DIR.build"
	rm -rf "$work"
	mkdir -p "$work"
	local root="$work/root"
	local include
	include=$(IFS=,; echo "${NODE_PACKAGES[*]}")
	# --variant=minbase: required packages and apt; no recommends, as a minimal node.
	run_logged "$log" mmdebstrap --mode=root --variant=minbase --include="$include" \
		--aptopt='APT::Install-Recommends "false"' \
		"$NODE_SUITE" "$root" \
		"deb $NODE_MIRROR $NODE_SUITE main" \
		"deb $NODE_MIRROR $NODE_SUITE-updates main" \
		"deb $NODE_SECURITY_MIRROR $NODE_SUITE-security main"
	configure_node_rootfs "$root" "$work"
	# The kernel and initramfs boot the VM directly (qemu -kernel/-initrd): no bootloader.
	local kver
	kver=$(basename "$(ls "$root"/boot/vmlinuz-*)")
	kver=${kver#vmlinuz-}
	cp "$root/boot/vmlinuz-$kver" "$work/vmlinuz"
	cp "$root/boot/initrd.img-$kver" "$work/initrd.img"
	# root=/dev/vda needs the virtio disk driver in the initramfs (initramfs-tools' default
	# MODULES=most puts it there); the 9p shares are mounted later, from the root's modules.
	# The guest's lsinitramfs: the host may have no initramfs-tools.
	local m initrd_list
	initrd_list=$(chroot "$root" lsinitramfs "/boot/initrd.img-$kver")
	for m in virtio_blk virtio_pci ext4; do
		grep -q "/$m\.ko" <<<"$initrd_list" || die "the node initramfs has no $m module"
	done
	for m in 9p 9pnet_virtio; do
		find "$root/lib/modules/$kver" -name "$m.ko*" | grep -q . || die "the node kernel has no $m module"
	done
	echo "$kver" >"$work/kernel-version"
	# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
	dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Package} ${Version}\n' >"$work/packages.txt"
	# 8 GiB, sparse: room for containerd's images and the pods' writable layers.
	run_logged "$log" mkfs.ext4 -q -F -L remora-node -d "$root" "$work/rootfs.ext4" 8G
	rm -rf "$root"
	rm -rf "$NODE_DIR"
	mv "$work" "$NODE_DIR"
	echo "$want" >"$stamp"
	info "node VM image ready in $NODE_DIR (kernel $kver, $(wc -l <"$NODE_DIR/packages.txt") packages, $((SECONDS - start)) s)"
}

# configure_node_rootfs ROOT KEYDIR: what the node's first boot needs: systemd-networkd with
# DHCP on the user-mode NIC, root login over ssh with the client key made here (KEYDIR/id_ed25519),
# a host key made here too (KEYDIR/known_hosts names it as host "remora-node").
configure_node_rootfs() {
	local root=$1 keys=$2
	echo remora-node >"$root/etc/hostname"
	printf '127.0.0.1 localhost\n127.0.1.1 remora-node\n' >"$root/etc/hosts"
	# qemu's user-mode DNS; the node needs none (the registry is named by address).
	echo 'nameserver 10.0.2.3' >"$root/etc/resolv.conf"
	printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
	cat >"$root/etc/systemd/network/10-user-nic.network" <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
EOF
	# The host keys openssh-server's postinst made are replaced by one known to the client.
	rm -f "$root"/etc/ssh/ssh_host_*
	ssh-keygen -q -t ed25519 -N '' -C remora-node -f "$root/etc/ssh/ssh_host_ed25519_key"
	ssh-keygen -q -t ed25519 -N '' -C remora-node-client -f "$keys/id_ed25519"
	echo "remora-node $(<"$root/etc/ssh/ssh_host_ed25519_key.pub")" >"$keys/known_hosts"
	install -d -m 0700 "$root/root/.ssh"
	install -m 0600 "$keys/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
	cat >"$root/etc/ssh/sshd_config.d/remora-node.conf" <<'EOF'
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
EOF
	run_logged "$LOGS/node-image.log" systemctl --root="$root" enable systemd-networkd.service ssh.service
	# Nothing periodic that would race the tests or slow the boot.
	run_logged "$LOGS/node-image.log" systemctl --root="$root" mask apt-daily.timer \
		apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer
	# Smaller image: the package lists are not needed to run.
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
}

main() {
	install_apt_packages
	# Before anything builds remora: build.rs compiles these.
	fetch_protos
	build_containerd
	build_cri_tools
	build_nri_stub_logger
	build_kubernetes kubelet agnhost
	build_runc
	fetch_deb busybox "$DEB_BUSYBOX_VERSION"
	fetch_deb nginx "$DEB_NGINX_VERSION"
	fetch_deb netcat-openbsd "$DEB_NETCAT_VERSION"
	check_rust
	install_cargo_deb
	install_shim
	info "tools ready in $TOOLS_BIN (containerd $CONTAINERD_VERSION, cri-tools $CRI_TOOLS_VERSION, kubelet $KUBELET_VERSION, runc $RUNC_VERSION)"
}

case "${1:-}" in
"") main ;;
# The node VM's base image only (scripts/node-vm.sh up runs this; the tools it installs in
# the guest are plain setup.sh's).
node-image) build_node_image ;;
# The node e2e suite's binaries (scripts/node-e2e.sh runs this).
node-e2e) build_kubernetes kubelet agnhost e2e_node.test ;;
# The cluster's binaries (scripts/cluster.sh up runs this), and Kubernetes' conformance suite
# (scripts/cluster.sh conformance runs this).
cluster) build_cluster ;;
cluster-e2e)
	build_kubernetes e2e.test
	go_module_build sample-apiserver k8s.io/sample-apiserver "$SAMPLE_APISERVER_VERSION" .
	;;
# Only the .proto files of protos/sources.txt (after a line there changed).
protos) fetch_protos ;;
# Only remora-nri's test plugin (crates/remora-nri/tests/launched_logger.rs runs it).
nri-plugin) build_nri_stub_logger ;;
*) die "usage: setup.sh [node-image|node-e2e|cluster|cluster-e2e|protos|nri-plugin]" ;;
esac
