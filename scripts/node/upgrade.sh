#!/usr/bin/env bash
# Runs in the node VM (scripts/node-test.sh: `bash -s -- IMAGE DEB`): remora's package upgraded
# in place while a pod runs, as an operator's `apt upgrade` does it. DEB, in the debs share, is
# a later version of the installed package. The upgrade must restart remora under systemd, keep
# the pod's container running (same process) and leave it reachable by exec; then the pod is
# removed.
set -euo pipefail
image=$1 deb=$2
say() { printf 'node: %s\n' "$*" >&2; }
fail() {
	say "FAILED: $*"
	journalctl -u remora -n 40 --no-pager -o cat >&2 || true
	exit 1
}
mkdir -p /root/upgrade
cd /root/upgrade
cat >pod.json <<EOF
{
  "metadata": { "name": "upgrade", "namespace": "default", "uid": "upgrade-$RANDOM$RANDOM", "attempt": 0 },
  "log_directory": "/var/log/pods/upgrade",
  "linux": { "cgroup_parent": "kubepods-besteffort-podupgrade.slice" }
}
EOF
cat >ctr.json <<EOF
{
  "metadata": { "name": "sleeper" },
  "image": { "image": "$image" },
  "command": ["sleep", "3600"],
  "log_path": "sleeper.log",
  "linux": {}
}
EOF
crictl pull "$image" >/dev/null || fail "crictl pull $image"
pod=$(crictl runp pod.json 2>&1) || fail "runp: $pod"
ctr=$(crictl create "$pod" ctr.json pod.json 2>&1) || fail "create: $ctr"
out=$(crictl start "$ctr" 2>&1) || fail "start: $out"
pid=$(crictl inspect -o go-template --template '{{.info.pid}}' "$ctr") || fail "inspect"
old_version=$(dpkg-query -W -f '${Version}' remora)
old_main=$(systemctl show -p MainPID --value remora)

dpkg -i "/mnt/debs/$deb" >&2 || fail "dpkg -i $deb"
new_version=$(dpkg-query -W -f '${Version}' remora)
[[ $new_version != "$old_version" ]] || fail "the package is still $old_version after dpkg -i $deb"
systemctl is-active remora >/dev/null || fail "remora is not active after the upgrade"
new_main=$(systemctl show -p MainPID --value remora)
[[ $new_main != "$old_main" && $new_main != 0 ]] || fail "remora was not restarted by the upgrade (pid $old_main -> $new_main)"
state=$(crictl inspect -o go-template --template '{{.status.state}} {{.info.pid}}' "$ctr") ||
	fail "inspect after the upgrade"
[[ $state == "CONTAINER_RUNNING $pid" ]] || fail "after the upgrade the container is '$state', was 'CONTAINER_RUNNING $pid'"
out=$(crictl exec "$ctr" echo upgraded 2>&1) || fail "exec after the upgrade: $out"
[[ $out == upgraded ]] || fail "exec after the upgrade answered: $out"
say "ok: upgrade $old_version -> $new_version restarted remora (pid $old_main -> $new_main); container $ctr kept running (pid $pid) and answers exec"
crictl stopp "$pod" >/dev/null || fail "stopp"
crictl rmp "$pod" >/dev/null || fail "rmp"
