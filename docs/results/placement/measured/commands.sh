#!/bin/sh
# The [DIST-IO] placement campaign on [FORGE]'s measured MareNostrum 4 curves, for
# docs/results/placement/measured/README.md (from the repository root). The loads, sets and seed of
# ../commands.sh (the synthetic-curve sweep), so the two are read side by side.
# 11 load points x 100 sets x (6 allocators x 3 placements + 3 robustness runs) = 23,100 simulations.
set -e
/usr/bin/time -v burstctl sim placement-sweep --curves measured \
  --loads 0.1 --loads 0.2 --loads 0.3 --loads 0.4 --loads 0.5 --loads 0.6 \
  --loads 0.8 --loads 1.0 --loads 1.2 --loads 1.5 --loads 2.0 \
  --sets 100 --seed 0 --workers 1 --out docs/results/placement/measured
