#!/usr/bin/env bash
# scripts/gpu-bundle's carried build runs where only glibc is: the bundle is made from the build,
# then copied into an empty root that holds nothing but glibc's libraries and loader (no Debian
# package of gpufleet's), and run there with chroot: `gpufleet --version`, a simulated probe, and
# a failed NVML load that must be reported, not crash (the driver is the target's). Needs root for
# chroot and a /proc mount (CI runs as root); skipped (exit 77) otherwise.
# Usage: gpu_bundle_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$1
build_dir=$2
if [ "$(id -u)" -ne 0 ]; then
  echo "gpu_bundle_test: chroot needs root; skipped"
  exit 77
fi
work=$(mktemp -d /tmp/gpufleet-bundle-XXXXXX)
trap 'umount "$work/root/proc" 2>/dev/null || true; rm -rf --one-file-system "$work"' EXIT
BUILD_DIR="$build_dir" "$source_dir/scripts/gpu-bundle" "$work/root/opt/gpufleet"

# glibc alone, from this machine: the loader and the libraries glibc's package ships.
mkdir -p "$work/root/lib64" "$work/root/lib/x86_64-linux-gnu" "$work/root/tmp" "$work/root/proc"
# The loader finds $ORIGIN through /proc/self/exe.
if ! mount -t proc proc "$work/root/proc"; then
  echo "gpu_bundle_test: cannot mount /proc for the chroot; skipped"
  exit 77
fi
cp -L /lib64/ld-linux-x86-64.so.2 "$work/root/lib64/"
for lib in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$work/root/lib/x86_64-linux-gnu/"
done

run() { chroot "$work/root" /opt/gpufleet/gpufleet "$@"; }
run --version | grep -q '^gpufleet '
run probe --backend simulated --gpus 2 --model H100-80GB | grep -q 'H100'
# No NVIDIA driver in this root: the NVML load fails with a message, the exit status is 1.
status=0
output=$(run probe 2>&1) || status=$?
if [ "$status" -eq 0 ] || ! grep -qi 'nvml' <<<"$output"; then
  echo "gpu_bundle_test: a probe without NVML gave status $status: $output" >&2
  exit 1
fi
echo "gpu_bundle_test: the bundle runs with glibc alone"
