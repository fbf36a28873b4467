#!/usr/bin/env bash
# The text-to-image check on a CUDA machine in one call (docs/text-to-image.md): benchmarks/gpu_check.sh's steps
# env, t2i_speed (AR against mcsjd and lantern on random LlamaGen-T2I GPT-XL and Janus-Pro-1B sized models, bf16,
# batch 1 and 8: $OUT/t2i_speed.json and t2i_speed.md), t2i_mllm (the same on random Emu3-Gen and Lumina-mGPT-7B
# sized models, batch 1 and 4, their first T2I_MLLM_ROWS (6) rows of codes, with peak memory: $OUT/t2i_mllm/) and
# t2i_tests (the text-to-image parity tests), within BUDGET_S (570) seconds. $OUT gets summary.log, env.log, one log
# per step and the tables.
#
#   bash benchmarks/gpu_check_t2i.sh                 # every step
#   bash benchmarks/gpu_check_t2i.sh t2i_speed       # only these steps
#
# Environment as in gpu_check.sh; OUT defaults to gpu_check_t2i_out. The models' weights are random, so their
# step compression says nothing about the released models (benchmarks/t2i_speed.py says why).
set -u

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env t2i_mllm t2i_speed t2i_tests)
OUT=${OUT:-gpu_check_t2i_out} BUDGET_S=${BUDGET_S:-570} exec bash "$(dirname "$0")/gpu_check.sh" "${steps[@]}"
