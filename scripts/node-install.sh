#!/usr/bin/env bash
# Installs remora on the node VM (scripts/node-vm.sh up) as an operator installs it on a
# Debian 12 node:
#   - containerd (setup.sh's CONTAINERD_VERSION) with containerd's own systemd unit and a main
#     config from `containerd config default`, runc (setup.sh's RUNC_VERSION) as /usr/local/sbin/runc,
#     crictl, the CNI plugins in /opt/cni/bin and a bridge network in /etc/cni/net.d;
#   - registry mirrors: the public registries the tests name are served by the test bed's
#     registry, the host's 127.0.0.1:5000, which the guest reaches as 10.0.2.2:5000
#     (scripts/testbed.sh up must be running);
#   - remora's Debian package (scripts/package.sh) with `dpkg -i`; remora.service is then
#     enabled and started by the package; its config as shipped but for the cgroup driver,
#     set to systemd as kubelet's is.
#
#   scripts/node-install.sh [DEB]   DEB: the package to install (default: the newest
#                                   remora_*.deb in node-vm.sh's "debs" share)
#
# Idempotent: a second run reinstalls the same files and restarts nothing that did not change
# (dpkg -i of the same package restarts remora).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NODE_VM="$SCRIPTS_DIR/node-vm.sh"
# The host's loopback as the guest sees it (qemu user-mode networking).
HOST_FROM_GUEST=10.0.2.2
# Public registries whose images the test bed's registry serves (as testbed.sh's MIRRORED_HOSTS).
MIRRORED_HOSTS="registry.k8s.io k8s.gcr.io docker.io gcr.io quay.io public.ecr.aws"

deb=${1:-}
if [[ -n "$deb" ]]; then
	[[ -f "$deb" ]] || die "no package file $deb"
	deb_name=$(basename "$deb")
	# The guest reads it from the debs share: it must be there.
	[[ "$(realpath "$(dirname "$deb")")" == "$(realpath "${REMORA_NODE_DEB_DIR:-$(cargo_target_dir)/debian}")" ]] ||
		die "$deb is not in the node VM's debs share (REMORA_NODE_DEB_DIR or cargo's target/debian)"
else
	deb_name=
fi
registry_port=${REGISTRY_ADDR##*:}
curl -fsS -o /dev/null --max-time 5 "$REGISTRY_URL/v2/" ||
	die "the test bed's registry ($REGISTRY_URL) does not answer: run scripts/testbed.sh up"

start=$SECONDS
info "installing containerd, runc, CNI plugins and remora on the node VM"
# The guest's part: a script on ssh's stdin, its arguments after `bash -s --`, quoted for the
# guest's shell (ssh joins its arguments into one command line; an empty one would vanish).
"$NODE_VM" ssh -- "bash -s -- $(printf '%q ' "$deb_name" "$HOST_FROM_GUEST:$registry_port" "$MIRRORED_HOSTS")" <<'GUEST'
set -euo pipefail
deb_name=$1 registry=$2 mirrored=$3
say() { printf 'node: %s\n' "$*" >&2; }

# ---- the host's shares (node-vm.sh), read-only -----------------------------------------
for tag in tools debs cni; do
	mkdir -p "/mnt/$tag"
	mountpoint -q "/mnt/$tag" ||
		mount -t 9p -o trans=virtio,version=9p2000.L,ro "$tag" "/mnt/$tag"
done

# ---- containerd, runc, crictl, CNI plugins: release binaries in /usr/local -------------
install -m 0755 /mnt/tools/bin/containerd /mnt/tools/bin/containerd-shim-runc-v2 \
	/mnt/tools/bin/ctr /mnt/tools/bin/crictl /usr/local/bin/
install -m 0755 /mnt/tools/bin/runc-pinned /usr/local/sbin/runc
install -d /opt/cni/bin
cp /mnt/cni/* /opt/cni/bin/

# containerd's own unit (containerd/containerd containerd.service), for /usr/local/bin.
cat >/etc/systemd/system/containerd.service <<'EOF'
[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd

Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5

# Having non-zero Limit*s causes performance problems due to accounting overhead
# in the kernel. We recommend using cgroups to do container-local accounting.
LimitNPROC=infinity
LimitCORE=infinity

# Comment TasksMax if your systemd version does not supports it.
# Only systemd 226 and above support this version.
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
EOF

# The main config as containerd writes it: it imports /etc/containerd/conf.d/*.toml, where
# the remora package puts its drop-in.
install -d /etc/containerd/conf.d
containerd config default >/etc/containerd/config.toml.new
grep -qF "imports = ['/etc/containerd/conf.d/*.toml']" /etc/containerd/config.toml.new || {
	say "containerd config default has no imports of /etc/containerd/conf.d:"
	grep '^imports' /etc/containerd/config.toml.new >&2
	exit 1
}
mv /etc/containerd/config.toml.new /etc/containerd/config.toml

# ---- registry mirrors: the test bed's registry for the public registries ---------------
# remora resolves through /etc/remora/certs.d (its [images] config_path); containerd's CRI
# and transfer service (which downloads remora's layers) through /etc/containerd/certs.d.
cat >/etc/containerd/conf.d/10-registry-mirrors.toml <<'EOF'
version = 3

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = '/etc/containerd/certs.d'

[plugins.'io.containerd.transfer.v1.local']
  config_path = '/etc/containerd/certs.d'
EOF
for dir in /etc/containerd/certs.d /etc/remora/certs.d; do
	for host in $mirrored; do
		server=https://$host
		[[ $host == docker.io ]] && server=https://registry-1.docker.io
		install -d "$dir/$host"
		cat >"$dir/$host/hosts.toml" <<EOF
# node-install.sh: $host served by the test bed's registry on the host.
server = "$server"

[host."http://$registry"]
  capabilities = ["pull", "resolve"]
EOF
	done
done

# ---- the pod network ------------------------------------------------------------------
install -d /etc/cni/net.d
cat >/etc/cni/net.d/10-bridge.conflist <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "node-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "10.88.0.0/16" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF

systemctl daemon-reload
systemctl enable containerd.service >/dev/null 2>&1
systemctl restart containerd.service
ctr version >/dev/null

# ---- remora, from its Debian package --------------------------------------------------
if [[ -z "$deb_name" ]]; then
	shopt -s nullglob
	debs=(/mnt/debs/remora_*.deb)
	shopt -u nullglob
	((${#debs[@]})) || { say "no remora_*.deb in the debs share: run scripts/package.sh"; exit 1; }
	# shellcheck disable=SC2012 # package file names have no odd characters
	deb_name=$(basename "$(ls -t "${debs[@]}" | head -n 1)")
fi
say "dpkg -i $deb_name"
dpkg -i "/mnt/debs/$deb_name" >&2
systemctl is-active remora >/dev/null || {
	say "remora.service is not active after dpkg -i:"
	systemctl status --no-pager remora >&2 || true
	journalctl -u remora --no-pager -n 50 >&2 || true
	exit 1
}
install -m 0644 /usr/share/doc/remora/examples/crictl.yaml /etc/crictl.yaml

# kubelet's default cgroup driver (kubeadm's too) is systemd: remora must use the same one
# (docs/operating.md). The operator's edit of the shipped config, and a restart.
sed -i -E 's/^cgroup_driver = .*/cgroup_driver = "systemd"/' /etc/remora/config.toml
grep -q '^cgroup_driver = "systemd"' /etc/remora/config.toml || {
	say "no cgroup_driver line in /etc/remora/config.toml to set"
	exit 1
}
systemctl restart remora
systemctl is-active remora >/dev/null || {
	say "remora.service is not active with cgroup_driver = systemd:"
	journalctl -u remora --no-pager -n 50 >&2 || true
	exit 1
}
crictl version >&2
GUEST
info "installed on the node VM in $((SECONDS - start)) s"
