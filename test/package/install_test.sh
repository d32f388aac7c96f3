#!/usr/bin/env bash
# The package on a clean Debian 12 booted with systemd (issue 39 item 3, docs/operations.md,
# "Install test"): a root made by mmdebstrap from Debian's packages (systemd and the package's
# Depends, so the install itself needs no network), booted in podman with --systemd=always; the
# .deb installed with apt; the server and an agent (simulated GPUs, process runner) started by
# their units; the agent joins with a join token; a job runs to completion; each unit is
# restarted and the fleet comes back (the job history kept, a second job runs); the package
# removed with the data left in place. Needs root, podman with runc, mmdebstrap and the Debian
# mirror (or ROOTFS, a tar a previous run kept). Not in ctest: making the root takes 2-5 minutes
# on 2 cores, more than CI's 25-minute budget leaves (bench/RESULTS.md has its timing).
# Usage: test/package/install_test.sh DEB [ROOTFS.tar]
set -euo pipefail

deb=$(realpath "${1:?usage: install_test.sh DEB [ROOTFS.tar]}")
rootfs=${2:-}
work=$(mktemp -d)
name="gpufleet-install-$$"
image="localhost/gpufleet-install-root:$$"
# Podman's default ulimits exceed this host's hard limits (../shared/facts/containers.md).
printf '[containers]\ndefault_ulimits = []\n' >"$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf
start=$(date +%s)
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "install_test: $*" >&2
  podman exec "$name" journalctl --no-pager -n 40 -u gpufleet-server -u gpufleet-agent >&2 || true
  exit 1
}
step() {
  echo "install_test: $(($(date +%s) - start)) s: $*"
}
in_root() {
  podman exec "$name" "$@"
}
# Runs the CLI in the booted root against the server on its loopback.
cli() {
  podman exec -e GPUFLEET_ADDR=http://127.0.0.1:8080 -e GPUFLEET_TOKEN="$admin" "$name" \
    gpufleet "$@"
}
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq $((seconds * 4))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  fail "timed out after ${seconds} s waiting for $what"
}

for tool in podman runc dpkg-deb; do
  command -v "$tool" >/dev/null || fail "$tool not found"
done

# The package's dependencies, named as Debian packages ("libc6 (>= 2.34), adduser" -> names).
depends=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/[(|].*//; s/ //g' | grep -v '^$' |
  paste -sd, -)
if [ -z "$rootfs" ]; then
  command -v mmdebstrap >/dev/null || fail "mmdebstrap not found (apt-get install mmdebstrap)"
  rootfs=$work/root.tar
  step "making a Debian 12 root with systemd and $depends"
  mmdebstrap --quiet --variant=apt --include="systemd,systemd-sysv,dbus,$depends" bookworm \
    "$rootfs" || fail "mmdebstrap failed"
fi
podman import --quiet "$rootfs" "$image" >/dev/null
step "booting it with systemd (no network but loopback)"
podman run -d --name "$name" --runtime runc --systemd=always --network none "$image" /sbin/init \
  >/dev/null
system_up() {
  local state
  state=$(in_root systemctl is-system-running 2>/dev/null || true)
  [ "$state" = running ] || [ "$state" = degraded ]
}
wait_for 60 "systemd to boot" system_up

step "installing $(basename "$deb") with apt"
podman cp "$deb" "$name:/tmp/gpufleet.deb"
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
  /tmp/gpufleet.deb >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt install failed"; }
in_root id gpufleet >/dev/null || fail "no gpufleet system user"
in_root test -f /etc/gpufleet/server.yaml || fail "no /etc/gpufleet/server.yaml"

step "starting gpufleet-server by its unit"
in_root sh -c 'sed -i "s/^listen: .*/listen: 127.0.0.1:8080/" /etc/gpufleet/server.yaml'
in_root systemctl enable --now gpufleet-server >/dev/null 2>&1 || fail "enabling the server failed"
admin_token() {
  admin=$(in_root journalctl -u gpufleet-server -o cat --no-pager |
    sed -n 's/^admin token (shown once, keep it): //p' | head -1)
  [ -n "$admin" ]
}
wait_for 30 "the server's one-time admin token in the journal" admin_token
wait_for 30 "the server to answer" cli get nodes
[ "$(in_root stat -c %U /var/lib/gpufleet/gpufleet.db)" = gpufleet ] ||
  fail "the store is not owned by the gpufleet user"

step "joining an agent with a join token"
join=$(cli create token --role agent --name fleet-agents | grep -o '[0-9a-f]\{64\}' | head -1)
[ -n "$join" ] || fail "no join token printed"
in_root sh -c "umask 077 && printf '%s\n' '$join' >/etc/gpufleet/agent-token"
in_root sh -c 'cat >/etc/gpufleet/agent.yaml <<EOF
server: http://127.0.0.1:8080
token-file: /etc/gpufleet/agent-token
node-name: install-node
backend: simulated
simulated-gpus: 2
runner: process
metrics-listen: 127.0.0.1:9400
stop-grace-s: 5
EOF'
in_root systemctl enable --now gpufleet-agent >/dev/null 2>&1 || fail "enabling the agent failed"
node_ready() {
  cli get nodes | grep -q 'install-node .*Ready'
}
wait_for 60 "install-node to be Ready" node_ready

job_succeeded() {  # job_succeeded NAME
  cli get jobs | grep -q "^$1 .*Succeeded"
}
submit() {  # submit NAME
  in_root sh -c "cat >/tmp/$1.yaml <<EOF
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: $1}
spec:
  tasks:
    - name: main
      command: [sh, -c, 'echo hello from \$GPUFLEET_JOB; sleep 1']
      resources: {cpu: \"1\", memory: 256Mi, gpus: {count: 1}}
EOF"
  cli submit -f "/tmp/$1.yaml" >/dev/null || fail "submitting $1 failed"
}
step "a job through the units"
submit first
wait_for 60 "job first to succeed" job_succeeded first

step "restarting each unit"
in_root systemctl restart gpufleet-server || fail "restarting the server failed"
wait_for 30 "the server to answer after its restart" cli get nodes
job_succeeded first || fail "job first is gone or changed after the server's restart"
in_root systemctl restart gpufleet-agent || fail "restarting the agent failed"
wait_for 60 "install-node to be Ready after the agent's restart" node_ready
submit second
wait_for 60 "job second to succeed" job_succeeded second
for unit in gpufleet-server gpufleet-agent; do
  [ "$(in_root systemctl is-active "$unit")" = active ] || fail "$unit is not active"
done

step "removing the package"
in_root env DEBIAN_FRONTEND=noninteractive apt-get remove -y -q gpufleet >"$work/remove.log" 2>&1 ||
  { cat "$work/remove.log" >&2; fail "apt remove failed"; }
in_root test ! -e /usr/bin/gpufleet || fail "/usr/bin/gpufleet is still there"
in_root test -s /var/lib/gpufleet/gpufleet.db || fail "the store was removed with the package"
in_root test -f /etc/gpufleet/server.yaml || fail "the configuration was removed (not purged)"
if in_root systemctl is-active gpufleet-server >/dev/null 2>&1; then
  fail "gpufleet-server still runs after the removal"
fi
step "passed"
