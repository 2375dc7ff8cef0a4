#!/bin/sh
# The exact commands behind docs/results/dpsac/ (run from this directory; ~30 s in all on
# one core). Seeds 0..4 for every row (--runs 5 --seed 0).
set -e
burstctl sim dpsac-plot --out default --runs 5 --seed 0
burstctl sim dpsac-plot --out no-slowdown --runs 5 --seed 0 --knee 1
burstctl sim dpsac-plot --out synchronous --runs 5 --seed 0 --release-spread 0
burstctl sim dpsac-plot --out unit-1s --runs 5 --seed 0 --unit 1
for j in eap lap5 silverton; do
  burstctl sim dpsac-join --joiner $j --runs 5 --seed 0 --format json > join_$j.jsonl
  burstctl sim dpsac-join --joiner $j --runs 5 --seed 0 --release-spread 0 --format json \
    > join_${j}_synchronous.jsonl
done
