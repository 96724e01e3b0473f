#!/usr/bin/env bash
# Big-image pull benchmark, remora vs the test bed containerd's built-in CRI, in one run on the
# same test bed: cold pulls (crictl) of
#   layers: an image of L layers of M MiB of random, incompressible data (gzip'ed tar);
#   config: an image of one small layer whose config is C MiB (build history entries).
# Both images are generated from /dev/urandom (python's os.urandom) and pushed to the local
# registry just before each pull, never committed; each pull gets a fresh image, so nothing of
# it is in containerd's content store (which is shared across namespaces). The runtimes
# alternate, and which one goes first flips every round (an even --rounds gives each the
# same number of first places); every pull starts after a sync. After each pull the image is
# removed and its blobs deleted from the registry's storage.
#
#   scripts/bench-pull-big.sh [--layers 8] [--layer-mb 64] [--config-mb 64] [--rounds 3]
#                             [--only layers|config] [--ctr]
#
#   --ctr  also pull each image with containerd's own client, ctr (the test bed's, in
#          namespace bench-ctr), both ways it can: through containerd's Transfer service
#          (containerd fetches and unpacks in-process, as its CRI does) and with --local
#          (ctr fetches and writes the blobs into containerd over gRPC, as remora does);
#          the ratio column is then that pull's speed against remora's
#
# Prints per image the median wall time and MiB/s (blob bytes of the image / wall time) of
# each runtime with the ratio remora/containerd (higher is better for remora), and remora's
# RSS around the pull: before, peak during (VmHWM, reset before the pull), after the pull,
# and after the image's removal; and the CPU time (user + system, seconds) each daemon spent
# during the pull: containerd, remora and the registry (containerd's CRI pulls in-process, so
# for it remora's column stays near 0). The release build is used: REMORA_BIN, or cargo's
# release build, built first (common.sh's up_release_remora).
# Nothing here is a pass/fail assertion: it reports numbers.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

layers=8 layer_mb=64 config_mb=64 rounds=3 only="" with_ctr=""
while [[ $# -gt 0 ]]; do
	case $1 in
	--layers) layers=$2; shift 2 ;;
	--layer-mb) layer_mb=$2; shift 2 ;;
	--config-mb) config_mb=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	--ctr) with_ctr=1; shift ;;
	*) die "unknown argument $1" ;;
	esac
done

up_release_remora
CRICTL="$TOOLS_BIN/crictl"
CTR=("$TOOLS_BIN/ctr" -a "$TB_RUN/containerd.sock" -n bench-ctr)
remora_pid=$(<"$TB_RUN/remora.pid")
info "measuring remora $(readlink "/proc/$remora_pid/exe") (pid $remora_pid)"

kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }

# The daemons whose CPU time is measured around each pull, in the order printed.
cpu_pids=("$(<"$TB_RUN/containerd.pid")" "$remora_pid" "$(<"$TB_RUN/registry.pid")")
# cpu_ticks: user + system clock ticks so far of each of cpu_pids, space-separated (fields
# 14 and 15 of /proc/PID/stat, counted after the command name, which may hold spaces).
cpu_ticks() {
	local pid stat out=()
	for pid in "${cpu_pids[@]}"; do
		stat=$(<"/proc/$pid/stat")
		stat=${stat##*) }
		# shellcheck disable=SC2086 # split into fields on purpose
		set -- $stat
		out+=("$((${12} + ${13}))")
	done
	echo "${out[*]}"
}
hz=$(getconf CLK_TCK)

# push KIND REPO: pushes a fresh image of KIND; prints push_random.py's JSON.
push() {
	case $1 in
	layers) push_random_layers "$2" "$layers" "$layer_mb" ;;
	config) "$SCRIPTS_DIR/images/push_random.py" "$2" --layers 1 --layer-kb 64 \
		--config-kb "$((config_mb * 1024))" ;;
	esac
}

# one KIND RT: one cold pull; prints "seconds bytes rss_before peak rss_after rss_removed
# cpu_containerd cpu_remora cpu_registry" (RSS fields in KiB, remora only, "-" for
# containerd; CPU in seconds).
one() {
	local kind=$1 rt=$2 repo json ref start end before="-" peak="-" after="-" removed="-"
	local cpu0 cpu1
	repo="bench-big/$rt-$kind-$(date +%s%N)"
	json=$(push "$kind" "$repo")
	ref="registry.k8s.io/$repo:v1"
	if [[ $rt == remora ]]; then
		before=$(kib "$remora_pid" VmRSS)
		echo 5 >"/proc/$remora_pid/clear_refs" # VmHWM := VmRSS
	fi
	# The client's pull and remove commands; their stderr is kept for a failure's message
	# (ctr warns about cgroup v1 on every call).
	local pull rm err
	case $rt in
	ctr-transfer | ctr-local)
		pull=("${CTR[@]}" image pull --hosts-dir "$TB_ROOT/certs.d")
		[[ $rt == ctr-local ]] && pull+=(--local)
		rm=("${CTR[@]}" image rm --sync)
		;;
	*)
		pull=("$CRICTL" --config "$TB_ROOT/crictl-$rt.yaml" pull)
		rm=("$CRICTL" --config "$TB_ROOT/crictl-$rt.yaml" rmi)
		;;
	esac
	# The push (and the last round's pull and removal) left hundreds of MiB of dirty pages;
	# written back now, they do not slow down whichever pull comes next.
	sync
	cpu0=$(cpu_ticks)
	start=$(date +%s.%N)
	err=$("${pull[@]}" "$ref" 2>&1 >/dev/null) || die "pull of $ref ($kind) through $rt failed: $err"
	end=$(date +%s.%N)
	cpu1=$(cpu_ticks)
	if [[ $rt == remora ]]; then
		peak=$(kib "$remora_pid" VmHWM)
		after=$(kib "$remora_pid" VmRSS)
	fi
	err=$("${rm[@]}" "$ref" 2>&1 >/dev/null) || warn "removing $ref through $rt failed: $err"
	[[ $rt == remora ]] && removed=$(kib "$remora_pid" VmRSS)
	forget_pushed "$repo" "$json"
	awk -v s="$start" -v e="$end" -v b="$(jq .bytes <<<"$json")" \
		-v r="$before $peak $after $removed" -v c0="$cpu0" -v c1="$cpu1" -v hz="$hz" 'BEGIN {
		n = split(c0, a, " "); split(c1, z, " ")
		printf "%.3f %d %s", e - s, b, r
		for (i = 1; i <= n; i++) printf " %.2f", (z[i] - a[i]) / hz
		printf "\n" }'
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
# median_of "V V ...": the median of a space-separated list (as the rounds collect them).
median_of() { tr ' ' '\n' <<<"$1" | grep . | median; }

kinds=(layers config)
[[ -n $only ]] && kinds=("$only")
for kind in "${kinds[@]}"; do
	declare -A secs=() last=() cpu=()
	bytes=0
	for ((round = 1; round <= rounds; round++)); do
		order=(remora containerd)
		[[ -n $with_ctr ]] && order+=(ctr-transfer ctr-local)
		if ((round % 2 == 0)); then
			reversed=()
			for ((i = ${#order[@]} - 1; i >= 0; i--)); do reversed+=("${order[i]}"); done
			order=("${reversed[@]}")
		fi
		for rt in "${order[@]}"; do
			read -r s b rb rp ra rr cc cr cg <<<"$(one "$kind" "$rt")"
			info "$kind round $round: $rt ${s}s (CPU s: containerd $cc, remora $cr, registry $cg)"
			secs[$rt]+="$s "
			cpu[$rt.containerd]+="$cc " cpu[$rt.remora]+="$cr " cpu[$rt.registry]+="$cg "
			bytes=$b
			[[ $rt == remora ]] && last[rss]="$rb $rp $ra $rr"
		done
	done
	r_s=$(median_of "${secs[remora]}")
	c_s=$(median_of "${secs[containerd]}")
	case $kind in
	layers) what="$layers x $layer_mb MiB incompressible layers" ;;
	config) what="a $config_mb MiB config" ;;
	esac
	echo "cold pull of an image with $what ($bytes bytes), median of $rounds, alternating"
	printf '%-28s %12s %12s %12s\n' "" remora containerd "remora/ctrd"
	awk -v r="$r_s" -v c="$c_s" -v b="$bytes" 'BEGIN {
		printf "%-28s %12.3f %12.3f %11.2fx\n", "wall time (s)", r, c, c / r
		printf "%-28s %12.1f %12.1f %11.2fx\n", "MiB/s", b / r / 1048576, b / c / 1048576, c / r }'
	for d in containerd remora registry; do
		awk -v d="$d" -v r="$(median_of "${cpu[remora.$d]}")" \
			-v c="$(median_of "${cpu[containerd.$d]}")" \
			'BEGIN { printf "%-28s %12.2f %12.2f\n", "CPU s: " d, r, c }'
	done
	for rt in ctr-transfer ctr-local; do
		[[ -n ${secs[$rt]:-} ]] || continue
		x_s=$(median_of "${secs[$rt]}")
		awk -v rt="$rt" -v x="$x_s" -v r="$r_s" -v b="$bytes" \
			-v cc="$(median_of "${cpu[$rt.containerd]}")" 'BEGIN {
			printf "%-28s %12.3f s %8.1f MiB/s, remora/%s %.2fx; CPU s: containerd %.2f\n",
				rt " (ctr)", x, b / x / 1048576, rt, x / r, cc }'
	done
	read -r rb rp ra rr <<<"${last[rss]}"
	echo "remora RSS (KiB, last round): before $rb, peak $rp, after pull $ra, after removal $rr"
	echo
done
# ctr's images are gone (each removed with a synchronous GC); its namespace goes too.
[[ -z $with_ctr ]] || "${CTR[@]:0:3}" namespaces rm bench-ctr >/dev/null 2>&1 ||
	info "containerd namespace bench-ctr left behind (something of the pulls is still in it)"
