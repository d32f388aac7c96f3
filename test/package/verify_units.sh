#!/usr/bin/env bash
# `systemd-analyze verify` on the shipped units (deploy/systemd/), with ExecStart pointing at the
# built binary (the packaged /usr/bin/gpufleet does not exist on a build host). verify only warns
# about a bad value or an unknown key and exits 0, so any output fails the test too.
# Usage: verify_units.sh GPUFLEET_BINARY SOURCE_DIR
set -euo pipefail
binary=$1
source_dir=$2
if ! command -v systemd-analyze >/dev/null; then
  echo "systemd-analyze not found: install Debian's systemd package (scripts/setup)" >&2
  exit 1
fi
work=$(mktemp -d /tmp/gpufleet-units-XXXXXX)
trap 'rm -rf "$work"' EXIT
for unit in "$source_dir"/deploy/systemd/*.service; do
  sed "s#/usr/bin/gpufleet #$binary #" "$unit" >"$work/$(basename "$unit")"
  grep -q "^ExecStart=$binary " "$work/$(basename "$unit")"
done
status=0
output=$(systemd-analyze verify "$work"/*.service 2>&1) || status=$?
if [ "$status" -ne 0 ] || [ -n "$output" ]; then
  echo "systemd-analyze verify failed (exit $status):" >&2
  echo "$output" >&2
  exit 1
fi
echo "verified: $(cd "$work" && echo *.service)"
