#!/usr/bin/env bash
# Runs sim_speed, decision_latency and replica_sync (8 replicas x 1,000 jobs) of two
# checkouts, interleaved (old, new, old, new, ...), so that both see the same machine.
# Each checkout needs its own .venv (make test or make run there once).
#
#   bench/side_by_side.sh OLD_CHECKOUT NEW_CHECKOUT OUT_DIR
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2"); out=$(realpath -m "$3")
mkdir -p "$out"
run() {  # run TREE LABEL NAME ARGS...
    local tree=$1 label=$2 name=$3; shift 3
    (cd "$tree" && .venv/bin/python "bench/$name.py" "$@" > "$out/${name}_${label}.json")
}
for round in 1 2 3; do
    for side in old new; do
        tree=$old; [ "$side" = new ] && tree=$new
        run "$tree" "${side}_$round" sim_speed
        run "$tree" "${side}_$round" decision_latency
    done
done
for round in 1 2; do
    for side in old new; do
        tree=$old; [ "$side" = new ] && tree=$new
        run "$tree" "${side}_$round" replica_sync --replicas 8 --jobs 1000 --trials 3
    done
done
