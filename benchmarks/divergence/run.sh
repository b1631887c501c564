#!/usr/bin/env bash
# Run the divergence checks and timings of docs/verification-numerics.md.
#   run.sh check BIN MODEL [P] [FA]   rows of batches 2..17 against single decodes, 1..4 threads
#   run.sh dump  BIN MODEL N T [P] [FA]  which graph op differs first, for a batch of N rows at T threads
#   run.sh bench STOCK_BIN PATCHED_BIN MODEL [P] [ROUNDS]  interleaved timings, 1 thread, CPU time
# BIN: built by build.sh. Models: the SmolLM2 Q4_1 file and copies made by requant.py.
set -euo pipefail
mode="$1"; shift
case "$mode" in
  check) "$1" -m "$2" -t 1,2,3,4 -n 2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17 -p "${3:-40}" --fa "${4:--1}" ;;
  dump)  "$1" -m "$2" --dump "$3" -t "$4" -p "${5:-40}" --fa "${6:--1}" --first 8 ;;
  bench)
    for round in $(seq "${5:-5}"); do
      for bin in "$1" "$2"; do
        echo "round=$round bin=$(basename "$bin") $("$bin" -m "$3" -t 1 --bench --reps 5 -p "${4:-40}" | grep BENCH)"
      done
    done ;;
  *) echo "usage: run.sh check|dump|bench ..." >&2; exit 2 ;;
esac
