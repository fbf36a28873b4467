#!/usr/bin/env bash
# The text-to-image check on a CUDA machine in one call (docs/text-to-image.md): benchmarks/gpu_check.sh's steps
# env, t2i_speed (AR against mcsjd and lantern on random LlamaGen-T2I GPT-XL and Janus-Pro-1B sized models, bf16,
# batch 1 and 8: $OUT/t2i_speed.json and t2i_speed.md) and t2i_tests (the text-to-image parity tests), within
# BUDGET_S (480) seconds. $OUT gets six files: summary.log, env.log, t2i_speed.log, t2i_tests.log and the two tables.
#
#   bash benchmarks/gpu_check_t2i.sh                 # every step
#   bash benchmarks/gpu_check_t2i.sh t2i_speed       # only these steps
#
# Environment as in gpu_check.sh; OUT defaults to gpu_check_t2i_out. The models' weights are random, so their
# step compression says nothing about the released models (benchmarks/t2i_speed.py says why).
set -u

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env t2i_speed t2i_tests)
OUT=${OUT:-gpu_check_t2i_out} BUDGET_S=${BUDGET_S:-480} exec bash "$(dirname "$0")/gpu_check.sh" "${steps[@]}"
