#!/usr/bin/env bash
# Starts the replicas of one example setup on this machine and stops them (by pid) on Ctrl-C.
#   deploy/replicas/run.sh two     # r1 (400 MiB/s) + r2 (200 MiB/s)
#   deploy/replicas/run.sh three   # r1 (400) + r2 (200) + r3 (100 MiB/s)
# Needs `burstctl` on PATH (make run installs it into .venv/bin) or BURSTCTL=path/to/burstctl.
set -euo pipefail
setup=${1:?usage: $0 two|three}
here=$(cd "$(dirname "$0")" && pwd)
dir="$here/$setup"
[ -d "$dir" ] || { echo "no setup '$setup' in $here" >&2; exit 2; }
burstctl=${BURSTCTL:-$(command -v burstctl || echo "$here/../../.venv/bin/burstctl")}
pids=()
stop() { kill -TERM "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT INT TERM
for cfg in "$dir"/r*.toml; do
  "$burstctl" controller --config "$cfg" &
  pids+=($!)
done
echo "replicas of '$setup' running (pids ${pids[*]}); Ctrl-C stops them" >&2
wait
