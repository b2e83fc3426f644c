#!/usr/bin/env bash
# BENCH_LAUNCHER for a heap profile of the daemon (docs/benchmarks.md, "Where the heap goes"):
#   BENCH_LAUNCHER="bash e2e/scripts/heaptrack-launcher.sh /tmp/heap" make bench-all
# heaptrack runs in a session of its own, so the harness's stop (SIGTERM to the launcher's
# process group) reaches the daemon through the trap below and heaptrack still finishes
# writing its file; then `heaptrack_print /tmp/heap/vk-cocoon.*.zst` reads it.
set -euo pipefail
out=$1
shift
mkdir -p "$out"
setsid heaptrack -o "$out/vk-cocoon" "$@" >"$out/heaptrack.log" 2>&1 &
session=$!
stop() {
  pkill -TERM -s "$session" -f -- "$1" || true
  wait "$session" || true
  exit 0
}
trap 'stop "$1"' TERM INT
wait "$session"
