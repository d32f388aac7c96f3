#!/usr/bin/env bash
# The Debian package end to end without installing it: scripts/package on the test's build tree
# into a temporary directory; the .deb's name, files, maintainer scripts, conffiles and Debian
# dependencies; then the packaged binary, run from the unpacked tree, reads the packaged
# /etc/gpufleet/server.yaml and agent.yaml (--print-config) and shows their settings in effect.
# Usage: package_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$1
build_dir=$2
work=$(mktemp -d /tmp/gpufleet-package-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "package_test: $*" >&2
  exit 1
}

"$source_dir/scripts/package" --build-dir "$build_dir" "$work/out" >"$work/package.log" 2>&1 ||
  { cat "$work/package.log" >&2; fail "scripts/package failed"; }
version=$(sed -n 's/^project(gpufleet VERSION \([0-9.]*\) .*/\1/p' "$source_dir/CMakeLists.txt")
deb="$work/out/gpufleet_${version}_amd64.deb"
[ -f "$deb" ] || fail "no $deb (got: $(ls "$work/out"))"

dpkg-deb -c "$deb" | awk '{print $6}' >"$work/files"
for path in ./usr/bin/gpufleet ./lib/systemd/system/gpufleet-server.service \
  ./lib/systemd/system/gpufleet-agent.service ./etc/gpufleet/server.yaml \
  ./etc/gpufleet/agent.yaml ./var/lib/gpufleet/ ./usr/share/doc/gpufleet/operations.md \
  ./usr/share/doc/gpufleet/examples/prometheus/gpufleet-alerts.yaml \
  ./usr/share/doc/gpufleet/examples/grafana/gpufleet-control-plane.json; do
  grep -qx -- "$path" "$work/files" || fail "$path missing from the package"
done

depends=$(dpkg-deb -f "$deb" Depends)
for package in adduser libc6 libstdc++6 libfmt9 libyaml-cpp0.7 libsqlite3-0 libpq5; do
  echo "$depends" | grep -q "\b$package\b" || fail "Depends lacks $package: $depends"
done
[ "$(dpkg-deb -f "$deb" Package)" = gpufleet ] || fail "package name"
[ "$(dpkg-deb -f "$deb" Architecture)" = amd64 ] || fail "architecture"

mkdir "$work/control"
dpkg-deb -e "$deb" "$work/control"
for script in postinst prerm postrm; do
  [ -x "$work/control/$script" ] || fail "no executable $script"
done
grep -q 'adduser --system --group' "$work/control/postinst" || fail "postinst creates no user"
for conffile in /etc/gpufleet/server.yaml /etc/gpufleet/agent.yaml; do
  grep -qx "$conffile" "$work/control/conffiles" || fail "$conffile is not a conffile"
done

mkdir "$work/root"
dpkg-deb -x "$deb" "$work/root"
binary="$work/root/usr/bin/gpufleet"
"$binary" version | grep -q "^gpufleet $version$" || fail "packaged binary: $("$binary" version)"
server=$("$binary" server --config "$work/root/etc/gpufleet/server.yaml" --print-config) ||
  fail "the packaged server.yaml does not load"
echo "$server" | grep -qx 'data-dir: "/var/lib/gpufleet"' || fail "server.yaml: $server"
echo "$server" | grep -qx 'listen: "0.0.0.0:8080"' || fail "server.yaml: $server"
agent=$("$binary" agent --config "$work/root/etc/gpufleet/agent.yaml" --print-config) ||
  fail "the packaged agent.yaml does not load"
echo "$agent" | grep -qx 'state-dir: "/var/lib/gpufleet-agent"' || fail "agent.yaml: $agent"
echo "$agent" | grep -qx 'token-file: "/etc/gpufleet/agent-token"' || fail "agent.yaml: $agent"
echo "package_test: $(basename "$deb") ok"
