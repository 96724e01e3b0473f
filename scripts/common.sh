# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are used by the scripts that source this
# Shared paths and helpers for the remora test bed scripts (setup.sh,
# testbed.sh, critest.sh). Sourced, never executed: it only defines things.

# The repository root, whatever directory the caller runs from.
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPTS_DIR="$REPO_ROOT/scripts"

# Tools built by setup.sh live outside the repo so that `git clean` and fresh
# CI clones do not throw away ~2 minutes of Go builds.
TOOLS="${REMORA_TOOLS_DIR:-/var/tmp/remora-tools}"
TOOLS_BIN="$TOOLS/bin"
# The runc setup.sh builds (RUNC_VERSION there): the OCI runtime of the test bed's runc-running
# handlers, remora's and containerd CRI's alike. Not named `runc`, so that it shadows nothing.
PINNED_RUNC="$TOOLS_BIN/runc-pinned"

# TB_ROOT survives reboots (images, registry blobs, logs); TB_RUN holds
# sockets, pid files and runtime state that must not outlive the kernel.
TB_ROOT="${REMORA_TB_ROOT:-/var/lib/remora-testbed}"
TB_RUN="${REMORA_TB_RUN:-/run/remora-testbed}"

REGISTRY_ADDR=127.0.0.1:5000
REGISTRY_URL="http://$REGISTRY_ADDR"
CONTAINERD_SOCK="$TB_RUN/containerd.sock"
REMORA_SOCK="$TB_RUN/remora.sock"
# NRI sockets: the test bed's remora's (scripts/remora-testbed.toml, under its state dir)
# and its containerd's (scripts/testbed.sh's containerd config).
REMORA_NRI_SOCK="$TB_RUN/remora/nri.sock"
CONTAINERD_NRI_SOCK="$TB_RUN/nri.sock"

# Our tools first (the v2.3.4 containerd must find its own shim, not
# Debian's 1.6 one in /usr/bin); Go and cargo where these machines keep them,
# in case a non-interactive shell did not put them on PATH.
# The sbin directories too: runc, iptables and ip live there and a CI shell
# may not list them.
PATH="$TOOLS_BIN:$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/go/bin:${HOME:-/root}/.cargo/bin"
export PATH

# Everything we print goes to stderr except what callers may parse.
info() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
warn() { printf '%s: warning: %s\n' "${0##*/}" "$*" >&2; }
die() {
	printf '%s: error: %s\n' "${0##*/}" "$*" >&2
	exit 1
}

# run_logged LOGFILE CMD...: runs CMD with all its output in LOGFILE, so that
# long builds stay quiet; on failure shows the end of the log and fails.
run_logged() {
	local log="$1"
	shift
	mkdir -p "$(dirname "$log")"
	if ! "$@" >>"$log" 2>&1; then
		printf '%s: error: command failed: %s\n--- last 200 lines of %s ---\n' \
			"${0##*/}" "$*" "$log" >&2
		tail -n 200 "$log" >&2
		return 1
	fi
}

# proc_running PID: true for a live process; a zombie (dead, not yet reaped
# by whoever inherited it) does not count.
proc_running() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[[ ${stat:0:1} != Z ]]
}

# pid_alive PIDFILE: true when the pid file names a running process.
pid_alive() {
	local pid
	[[ -s "$1" ]] || return 1
	pid=$(<"$1")
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	proc_running "$pid"
}

# start_daemon NAME LOGFILE CMD...: runs CMD in its own session (it outlives the calling script
# and has no terminal), output appended to LOGFILE, its pid in the file `pidfile NAME` names
# (each script that uses this defines pidfile). setsid -f rather than `&`: background jobs of a
# non-interactive shell ignore SIGINT, and daemons would pass that on. With LOCK=PATH in the
# environment, the daemon holds an exclusive flock on PATH for its whole life (an inherited
# descriptor), or does not start.
start_daemon() {
	local name=$1 log=$2 pf
	shift 2
	pf=$(pidfile "$name")
	rm -f "$pf"
	mkdir -p "$(dirname "$log")"
	printf '\n==== %s: starting %s\n' "$(date -u +%FT%TZ)" "$*" >>"$log"
	# The daemon gets no descriptor beyond stdio (and LOCK's): one inherited from the caller would
	# outlive it, e.g. the caller's `flock /tmp/remora-bed.lock` lock, held by the daemon for good.
	# shellcheck disable=SC2016 # $$ and $1 belong to the inner shell
	LOCK=${LOCK:-} setsid -f bash -c '
		for fd in /proc/$$/fd/*; do
			fd=${fd##*/}
			if [[ $fd -gt 2 ]]; then eval "exec $fd>&-"; fi
		done
		if [[ -n "$LOCK" ]]; then
			exec 9>"$LOCK"
			flock -n 9 || { echo "$LOCK is held by another process" >&2; exit 75; }
		fi
		echo $$ >"$1"; shift; exec "$@"' start-daemon "$pf" "$@" \
		</dev/null >>"$log" 2>&1
	local i
	for ((i = 0; i < 50; i++)); do
		[[ -s "$pf" ]] && return 0
		sleep 0.1
	done
	tail -n 20 "$log" >&2 || true
	die "$name did not start (see $log)"
}

# stop_daemon NAME [SECONDS]: SIGTERM, wait (15 s by default), then SIGKILL.
stop_daemon() {
	local name=$1 secs=${2:-15} pf pid i
	pf=$(pidfile "$name")
	if ! pid_alive "$pf"; then
		rm -f "$pf"
		return 0
	fi
	pid=$(<"$pf")
	info "stopping $name (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < secs * 10; i++)); do
		proc_running "$pid" || break
		sleep 0.1
	done
	if proc_running "$pid"; then
		warn "$name did not stop after ${secs}s; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		sleep 0.5
	fi
	rm -f "$pf"
}

# cargo_target_dir: cargo's target directory for this repo (honours CARGO_TARGET_DIR and
# .cargo/config).
cargo_target_dir() {
	(cd "$REPO_ROOT" && cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
}

# The shim is built static, for musl (rust-toolchain.toml lists the target, so rustup installs
# it with the toolchain): one copy per pod shares no libc pages to count in its RSS, and musl's
# allocator keeps a small process small (docs/benchmarks.md, "The shim's memory").
SHIM_TARGET=x86_64-unknown-linux-musl

# build_shim: builds containerd-shim-remora-v2 (cargo's output on stderr) and prints the
# binary's path: static musl when the toolchain has that target, else (with a warning) the
# host's glibc build, which works the same.
build_shim() {
	local target profile_dir
	target=$(cargo_target_dir) || die "cannot find cargo's target directory"
	if (cd "$REPO_ROOT" && rustup target list --installed 2>/dev/null) | grep -qx "$SHIM_TARGET"; then
		(cd "$REPO_ROOT" && cargo build --locked --profile shim -p remora-shim \
			--bin containerd-shim-remora-v2 --target "$SHIM_TARGET") >&2
		profile_dir="$target/$SHIM_TARGET/shim"
	else
		warn "the Rust target $SHIM_TARGET is not installed: building the shim against glibc"
		(cd "$REPO_ROOT" && cargo build --locked --profile shim -p remora-shim \
			--bin containerd-shim-remora-v2) >&2
		profile_dir="$target/shim"
	fi
	echo "$profile_dir/containerd-shim-remora-v2"
}

# up_release_remora: builds remora's release binary and makes it the test bed's remora
# (testbed.sh restarts remora when the binary changed). Benchmarks run the optimised build.
# REMORA_BIN set: that binary instead, nothing built (to compare two builds).
up_release_remora() {
	local bin=${REMORA_BIN:-}
	if [[ -z "$bin" ]]; then
		info "cargo build --release --locked --bin remora"
		(cd "$REPO_ROOT" && cargo build --release --locked --bin remora 2>&1 | tail -n 1 >&2)
		bin="$(cargo_target_dir)/release/remora" || die "cannot find cargo's target directory"
	fi
	# testbed.sh restarts remora for a binary newer than the running one; make sure a
	# different (older) binary counts as new too.
	local pid running
	pid=$(cat "$TB_RUN/remora.pid" 2>/dev/null) || pid=
	running=$(readlink "/proc/${pid:-0}/exe" 2>/dev/null) || running=
	[[ -n "$running" && "$running" != "$(realpath "$bin")" ]] && touch "$bin"
	# The shim the test bed has installed stays (setup.sh would otherwise build one in this
	# target directory too); REMORA_SHIM_BIN set by the caller wins.
	local shim="$TOOLS_BIN/containerd-shim-remora-v2"
	[[ -x "$shim" ]] || shim=
	REMORA_SHIM_BIN="${REMORA_SHIM_BIN:-$shim}" REMORA_BIN="$bin" \
		"$SCRIPTS_DIR/testbed.sh" up >/dev/null
}

# The local registry's storage, where benchmarks delete the images they pushed.
REG_STORE="$TB_ROOT/registry/docker/registry/v2"

# push_random_layers REPO LAYERS MIB: pushes to the local registry a fresh image (tag v1) of
# LAYERS layers of MIB MiB of random, incompressible data each (gzip level 1, the fastest to
# make), content no runtime has seen; prints scripts/images/push_random.py's JSON. Pulled as
# registry.k8s.io/REPO:v1 (the test bed's registry mirror).
push_random_layers() {
	"$SCRIPTS_DIR/images/push_random.py" "$1" --layers "$2" --layer-kb "$(($3 * 1024))" \
		--gzip-level 1
}

# forget_pushed REPO JSON: deletes an image pushed by push_random.py (JSON: what it printed)
# from the registry's storage, its repository and blobs.
forget_pushed() {
	local d
	rm -rf "${REG_STORE:?}/repositories/$1"
	for d in $(jq -r '(.layers + [.config, .manifest])[]' <<<"$2"); do
		d=${d#sha256:}
		rm -rf "${REG_STORE:?}/blobs/sha256/${d:0:2}/$d"
	done
}

# The node VM's base image (setup.sh node-image) and the running VM's state (node-vm.sh).
NODE_DIR="$TOOLS/node-vm"
NODE_STATE="${REMORA_NODE_STATE:-/var/tmp/remora-node}"

# ginkgo_results REPORT: one line per spec of a ginkgo JSON report, sorted: `PASS|FAIL|SKIP
# <name>`, the name being the spec's container texts and leaf text joined by spaces. Suite-level
# nodes (BeforeSuite and the like) only show up when they did not pass, as they can fail a run.
# critest.sh and node-e2e.sh print their results with it.
ginkgo_results() {
	jq -r '
		.[].SpecReports[]?
		| (if .LeafNodeType == "It" then "" else "[" + .LeafNodeType + "]" end) as $kind
		| ([$kind] + (.ContainerHierarchyTexts // []) + [.LeafNodeText // ""]
		   | map(select(. != "")) | join(" ") | gsub("\\s+"; " ")) as $name
		| (if .State == "passed" then "PASS"
		   elif .State == "skipped" or .State == "pending" then "SKIP"
		   else "FAIL" end) as $result
		| select($kind == "" or $result == "FAIL")
		| $result + " " + $name
	' "$1" | LC_ALL=C sort
}

# check_ratchet RESULTS LIST NOUN: every name LIST names (one a line; whole-line # comments only,
# as names may contain '#') must be a PASS line of RESULTS (ginkgo_results' lines). Prints what
# did not pass and the passing names LIST lacks (candidates for it), then `ratchet: N passed,
# N failed`; returns 1 when a listed one did not pass. NOUN names them in messages (spec, test).
check_ratchet() {
	local results=$1 list=$2 noun=$3 bad=0 result name line
	local -A got=() listed=()
	while read -r result name; do
		got[$name]=$result
	done <"$results"
	while IFS= read -r line || [[ -n "$line" ]]; do
		line=${line#"${line%%[![:space:]]*}"}
		line=${line%"${line##*[![:space:]]}"}
		[[ -z "$line" || $line == \#* ]] && continue
		if [[ -z "${got[$line]+x}" ]]; then
			echo "check: not in this run: $line" >&2
			bad=$((bad + 1))
		elif [[ ${got[$line]} != PASS ]]; then
			echo "check: ${got[$line]}: $line" >&2
			bad=$((bad + 1))
		fi
		listed[$line]=1
	done <"$list"
	for name in "${!got[@]}"; do
		if [[ ${got[$name]} == PASS && -z "${listed[$name]+x}" ]]; then
			echo "check: passes but not listed in $list: $name" >&2
		fi
	done
	# The closing line counts the list's names (the suite's own totals are printed before).
	echo "ratchet: $((${#listed[@]} - bad)) passed, $bad failed"
	if [[ $bad -gt 0 ]]; then
		echo "check: $bad $noun(s) listed in $list did not pass" >&2
		return 1
	fi
	echo "check: every $noun listed in $list passed" >&2
}
