#!/usr/bin/env bash
# `gpufleet completion bash` completes subcommands and flags at any depth (issue 39).
set -euo pipefail
gpufleet="$1"
source <("$gpufleet" completion bash)
complete_line() {  # the words of a command line, the last one being completed
  COMP_WORDS=("$@")
  COMP_CWORD=$(($# - 1))
  _gpufleet
  echo "${COMPREPLY[*]}"
}
check() {  # EXPECTED WORDS...
  local expected="$1"
  shift
  local got
  got="$(complete_line "$@")"
  if [[ " $got " != *" $expected "* ]]; then
    echo "completing '$*': want $expected, got: $got" >&2
    exit 1
  fi
}
check sim gpufleet si
check chaos gpufleet sim ch
check --seeds gpufleet sim chaos --se
check --plant gpufleet sim chaos --seeds 1-3 --pl
check --policy gpufleet sim fill --po
check server gpufleet ser
check --node-timeout-s gpufleet server --node-timeout
check --strict gpufleet submit --st
check cancel gpufleet can
echo "completion ok"
