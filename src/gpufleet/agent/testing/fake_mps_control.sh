#!/bin/sh
# A stand-in for NVIDIA's nvidia-cuda-mps-control in the tests, which run without a GPU: a test
# double of the driver's program, not of gpufleet. It keeps to the real one's interface as far as
# gpufleet uses it:
#   -d                    starts a daemon in the background and returns; the daemon writes its pid
#                         to $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid and reads
#                         commands from the control pipe there until "quit";
#   (no argument)         sends each line of stdin to the daemon; exits 1 when none runs.
# Everything it does is logged to $CUDA_MPS_LOG_DIRECTORY/control.log, the real daemon's log
# file, so tests can read which GPU a daemon was started for and which commands it got. A file
# "ignore-quit" in the log directory makes the daemon log "quit" and keep running (a daemon that
# hangs, for the kill after the grace); a file "die-at-start" there makes the daemon end before it
# writes its pid file (a start that never comes up).
set -eu
pipes="${CUDA_MPS_PIPE_DIRECTORY:?}"
logs="${CUDA_MPS_LOG_DIRECTORY:-$pipes}"
log="$logs/control.log"
pid_file="$pipes/nvidia-cuda-mps-control.pid"

case "${1-}" in
  -d)
    mkdir -p "$pipes" "$logs"
    rm -f "$pipes/control"
    mkfifo "$pipes/control"
    nohup "$0" --daemon </dev/null >/dev/null 2>&1 &
    exit 0
    ;;
  --daemon)
    if [ -e "$logs/die-at-start" ]; then
      echo "died at start" >>"$log"
      exit 1
    fi
    echo "$$" >"$pid_file"
    echo "started CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} pid=$$" >>"$log"
    # Every line until the last writer closes the pipe, then open it again.
    while true; do
      while read -r command; do
        echo "command $command" >>"$log"
        if [ "$command" = quit ] && [ ! -e "$logs/ignore-quit" ]; then
          # Logged before the pid file goes: whoever sees it gone reads the whole log.
          echo "quit pid=$$" >>"$log"
          rm -f "$pid_file" "$pipes/control"
          exit 0
        fi
      done <"$pipes/control"
    done
    ;;
  "")
    if [ ! -s "$pid_file" ] || ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
      echo "Cannot find MPS control daemon process" >&2
      exit 1
    fi
    while read -r line; do
      echo "$line" >"$pipes/control"
    done
    ;;
  *)
    echo "usage: $0 [-d]" >&2
    exit 2
    ;;
esac
