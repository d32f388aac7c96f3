#!/usr/bin/env bash
# Stands in for `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` in the self-test of
# scripts/gpu-check.sh: the readings of gpu_check_nvml.json as nvidia-smi would print them
# (power rounded to hundredths of a watt, memory.used from an older driver that counts the
# reserved memory for GPU 1). FAKE_NVIDIA_SMI_TEMPERATURE_OFFSET shifts GPU 0's temperature.
set -euo pipefail
offset="${FAKE_NVIDIA_SMI_TEMPERATURE_OFFSET:-0}"
echo "0, GPU-0b8e3f1a-4c2d-11ee-9a61-0242ac120002, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 85, 40, 40980, 40066, $((65 + offset)), 608.12, 1980, 2619"
echo "1, GPU-0b8e3f1a-4c2d-11ee-9a61-0242ac120003, 00000000:2A:00.0, NVIDIA H100 80GB HBM3, 0, 0, 513, 81046, 33, 71.25, 345, 2619"
