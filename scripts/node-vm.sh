#!/usr/bin/env bash
# A stock Debian 12 Kubernetes node as a qemu VM, for testing remora as an operator installs it
# (scripts/node-install.sh, scripts/node-test.sh). The base image is setup.sh's (`setup.sh
# node-image`, cached in $TOOLS/node-vm); every `up` boots a fresh qcow2 overlay over it, so
# each run starts from a clean node.
#
#   scripts/node-vm.sh up                 boot the VM, wait until ssh and systemd are ready
#   scripts/node-vm.sh down               power it off (killed after a deadline), drop the overlay
#   scripts/node-vm.sh status             show whether it runs (exit status 3 if not)
#   scripts/node-vm.sh ssh [--] CMD...    run CMD in the guest as root (stdin passed through; as
#                                         with ssh, the guest's shell parses the joined CMD)
#   scripts/node-vm.sh scp SRC... DEST    scp; a path written node:PATH is the guest's
#
# The guest sees, read-only over 9p (mount tags):
#   tools   $TOOLS (setup.sh's containerd, runc, crictl, ...)
#   debs    the directory of remora's .deb (REMORA_NODE_DEB_DIR; default: cargo's
#           target/debian, where scripts/package.sh writes it)
#   cni     the host's CNI plugins, /usr/lib/cni (Debian's containernetworking-plugins, the
#           test bed's too)
# and the host's loopback as 10.0.2.2 (qemu user-mode networking): the test bed's registry is
# 10.0.2.2:5000 there.
#
# Environment:
#   REMORA_VM_ACCEL          tcg (default) or kvm. KVM guests hang on some hosts (this one's
#                            /dev/kvm exists, yet guests stall): ask for it explicitly.
#   REMORA_NODE_STATE        overlay, pid file, serial log ($NODE_STATE, /var/tmp/remora-node)
#   REMORA_NODE_BOOT_TIMEOUT seconds `up` waits for ssh and systemd (default 600: TCG is slow)
#   REMORA_NODE_DEB_DIR      see "debs" above
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PIDFILE="$NODE_STATE/qemu.pid"
PORTFILE="$NODE_STATE/ssh-port"
OVERLAY="$NODE_STATE/overlay.qcow2"
SERIAL_LOG="$NODE_STATE/serial.log"
QEMU_LOG="$NODE_STATE/qemu.log"
BOOT_TIMEOUT=${REMORA_NODE_BOOT_TIMEOUT:-600}
# The guest's memory and CPUs: a small node.
VM_MEMORY=4096
VM_CPUS=2

ssh_port() {
	[[ -s "$PORTFILE" ]] || die "the node VM is not up (no $PORTFILE): run $0 up"
	cat "$PORTFILE"
}

# ssh_opts PORT: the client options: our key, the host key setup.sh made (whatever the port),
# no prompts, bounded connection time.
ssh_opts() {
	printf '%s\n' -i "$NODE_DIR/id_ed25519" -o IdentitiesOnly=yes \
		-o UserKnownHostsFile="$NODE_DIR/known_hosts" -o HostKeyAlias=remora-node \
		-o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=5 \
		-o ServerAliveInterval=10 -o ServerAliveCountMax=6 -o LogLevel=ERROR
}

guest_ssh() {
	local port opts
	port=$(ssh_port)
	mapfile -t opts < <(ssh_opts)
	ssh "${opts[@]}" -p "$port" root@127.0.0.1 "$@"
}

# free_port: a TCP port nobody listens on on loopback (the kernel picks it).
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# accel_args: qemu's accelerator and CPU model for REMORA_VM_ACCEL.
accel_args() {
	case "${REMORA_VM_ACCEL:-tcg}" in
	tcg) printf '%s\n' -accel tcg,thread=multi -cpu max ;;
	kvm)
		[[ -w /dev/kvm ]] || die "REMORA_VM_ACCEL=kvm but /dev/kvm is not usable"
		printf '%s\n' -accel kvm -cpu host
		;;
	*) die "REMORA_VM_ACCEL must be tcg or kvm (got ${REMORA_VM_ACCEL})" ;;
	esac
}

deb_dir() {
	local d=${REMORA_NODE_DEB_DIR:-}
	[[ -n "$d" ]] || d="$(cargo_target_dir)/debian" || die "cannot find cargo's target directory"
	mkdir -p "$d"
	echo "$d"
}

# serial_tail: the end of the guest's console, for a failed boot.
serial_tail() {
	printf -- '--- last 40 lines of %s ---\n' "$SERIAL_LOG" >&2
	tail -n 40 "$SERIAL_LOG" >&2 || true
}

cmd_up() {
	if pid_alive "$PIDFILE"; then
		info "the node VM is already up (pid $(<"$PIDFILE"), ssh port $(<"$PORTFILE"))"
		return 0
	fi
	"$SCRIPTS_DIR/setup.sh" node-image
	mkdir -p "$NODE_STATE"
	rm -f "$OVERLAY" "$PIDFILE" "$PORTFILE" "$SERIAL_LOG" "$QEMU_LOG"
	run_logged "$QEMU_LOG" qemu-img create -q -f qcow2 -F raw -b "$NODE_DIR/rootfs.ext4" "$OVERLAY"
	local port debs accel
	port=$(free_port)
	debs=$(deb_dir)
	mapfile -t accel < <(accel_args)
	echo "$port" >"$PORTFILE"
	local start=$SECONDS
	info "booting the node VM (${REMORA_VM_ACCEL:-tcg}, kernel $(<"$NODE_DIR/kernel-version"), ssh on 127.0.0.1:$port; console: $SERIAL_LOG)"
	# -no-reboot with panic=-1: a guest that panics or reboots makes qemu exit, which the
	# wait below notices at once instead of at its deadline.
	run_logged "$QEMU_LOG" qemu-system-x86_64 -name remora-node "${accel[@]}" \
		-smp "$VM_CPUS" -m "$VM_MEMORY" -no-reboot \
		-kernel "$NODE_DIR/vmlinuz" -initrd "$NODE_DIR/initrd.img" \
		-append "root=/dev/vda rw console=ttyS0 panic=-1 systemd.unified_cgroup_hierarchy=1 apparmor=1 security=apparmor" \
		-drive "file=$OVERLAY,if=virtio,format=qcow2,cache=unsafe" \
		-netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$port-:22" \
		-device virtio-net-pci,netdev=net0 \
		-virtfs "local,path=$TOOLS,mount_tag=tools,security_model=none,readonly=on" \
		-virtfs "local,path=$debs,mount_tag=debs,security_model=none,readonly=on" \
		-virtfs "local,path=/usr/lib/cni,mount_tag=cni,security_model=none,readonly=on" \
		-display none -monitor none -serial "file:$SERIAL_LOG" \
		-daemonize -pidfile "$PIDFILE"
	wait_ready "$start"
	info "the node VM is ready ($((SECONDS - start)) s from qemu's start)"
}

# wait_ready START: polls ssh until it answers, then waits for systemd to finish booting; gives
# up at START + BOOT_TIMEOUT (or as soon as qemu is gone).
wait_ready() {
	local deadline=$(($1 + BOOT_TIMEOUT))
	until guest_ssh true 2>/dev/null; do
		pid_alive "$PIDFILE" || {
			serial_tail
			die "qemu exited during the boot"
		}
		((SECONDS < deadline)) || {
			serial_tail
			die "no ssh answer from the node VM within $BOOT_TIMEOUT s"
		}
		sleep 1
	done
	info "ssh answers after $((SECONDS - $1)) s"
	local left=$((deadline - SECONDS)) state
	((left > 0)) || left=1
	state=$(guest_ssh timeout "$left" systemctl is-system-running --wait) || true
	case "$state" in
	running) ;;
	degraded)
		warn "the node's systemd is degraded; failed units:"
		guest_ssh systemctl --failed --no-legend >&2 || true
		;;
	*) die "the node's systemd did not finish booting within $BOOT_TIMEOUT s (state: ${state:-none})" ;;
	esac
}

cmd_down() {
	if pid_alive "$PIDFILE"; then
		local pid deadline
		pid=$(<"$PIDFILE")
		info "powering the node VM off (pid $pid)"
		# A guest whose ssh does not answer (still booting, hung) is killed at once.
		if guest_ssh true 2>/dev/null; then
			# The connection drops as the guest goes down: ssh's status says nothing.
			guest_ssh timeout 10 systemctl poweroff 2>/dev/null || true
			deadline=$((SECONDS + 60))
			while proc_running "$pid" && ((SECONDS < deadline)); do sleep 1; done
		fi
		if proc_running "$pid"; then
			warn "the node VM did not power off; killing qemu"
			kill "$pid" 2>/dev/null || true
			deadline=$((SECONDS + 10))
			while proc_running "$pid" && ((SECONDS < deadline)); do sleep 0.5; done
			if proc_running "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
		fi
	fi
	# The serial and qemu logs stay for a post-mortem; the next `up` replaces them.
	rm -f "$OVERLAY" "$PIDFILE" "$PORTFILE"
}

cmd_status() {
	if pid_alive "$PIDFILE"; then
		echo "node VM   running (pid $(<"$PIDFILE"), ssh 127.0.0.1:$(<"$PORTFILE"), console $SERIAL_LOG)"
	else
		echo "node VM   stopped"
		return 3
	fi
}

cmd_scp() {
	(($# >= 2)) || die "usage: $0 scp SRC... DEST (node:PATH for the guest's paths)"
	local port opts args=() a
	port=$(ssh_port)
	mapfile -t opts < <(ssh_opts)
	for a in "$@"; do
		[[ $a == node:* ]] && a="root@127.0.0.1:${a#node:}"
		args+=("$a")
	done
	scp "${opts[@]}" -P "$port" "${args[@]}"
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
ssh)
	shift
	[[ "${1:-}" == -- ]] && shift
	guest_ssh "$@"
	;;
scp)
	shift
	cmd_scp "$@"
	;;
*) die "usage: $0 up|down|status|ssh [--] CMD...|scp SRC... DEST" ;;
esac
