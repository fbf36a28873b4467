#!/usr/bin/env bash
# Continue training the prompt-driven shapes-t2i model on one CUDA GPU in one call (docs/models/shapes-t2i.md),
# package it and measure its prompt faithfulness, so that a device lent for 15 minutes spends them on training
# rather than setup.
#
#   bash benchmarks/gpu_train_t2i.sh
#
# Nothing needs carrying: the device renders the captioned scenes with all its cores and tokenises them on the GPU.
# Steps: train the text encoder and image model from INIT (vgen train t2i; the shipped pipeline by default, or an AR
# model folder such as vgen/assets/shapes-c2i/gpt for a new text encoder), ending annealed TRAIN_END_S seconds
# after the script starts at whatever speed the device runs (train_until in gpu_pack.sh: a probe of PROBE_S
# seconds, then the cosine laid over the steps that fit, at most STEPS); package in bf16; then `vgen quality` on
# NUM_EVAL held-out prompts, judged by JUDGE (the shipped scene judge), or by a judge this run trains first when
# JUDGE_STEPS > 0 (vgen train scene-judge, for JUDGE_MIN minutes at most). The device returns at most 8 files of at
# most 16 MiB each, so $OUT gets: train.log, summary.txt (the quality figures, and the trained judge's held-out
# accuracy), and result.tar (pipe/, t2i_log.jsonl, quality.json, grid.png; a trained judge/ and judge_log.jsonl)
# split into 15 MiB parts result.tar.part-NN with its sha256 in result.tar.sha256; `cat result.tar.part-* | tar -x`
# unpacks it. The package is packed before it is measured, so a failed measurement still returns the weights.
#
# Environment (defaults): OUT (gpu_t2i_out), DEVICE (cuda), DATA (runs/data-scenes), RUN (runs/gpu-t2i), INIT
# (vgen/assets/shapes-t2i), VQ (vgen/assets/shapes-t2i/vq), JUDGE (vgen/assets/shapes-scene-judge), JUDGE_RUN
# (runs/gpu-scene-judge), NUM_IMAGES (96000), JUDGE_STEPS (0), JUDGE_IMAGES (64000), JUDGE_VAL (2048), JUDGE_BATCH
# (256), JUDGE_MIN (1.5), STEPS (20000), BATCH (128), LR (3e-4), WARMUP (100), TRAIN_END_S (420), PROBE_S (45),
# EVAL_EVERY (1000), NUM_EVAL (512), QUALITY_BATCH (128), CFG (3.0), PRECISION (bf16). DEVICE=cpu with small counts
# is the dry run this script is tested by.
set -euo pipefail

cd "$(dirname "$0")/.."
source benchmarks/gpu_pack.sh
END_AT=$(($(date +%s) + ${TRAIN_END_S:-420}))
OUT=${OUT:-gpu_t2i_out}
DEVICE=${DEVICE:-cuda}
DATA=${DATA:-runs/data-scenes}
RUN=${RUN:-runs/gpu-t2i}
INIT=${INIT:-vgen/assets/shapes-t2i}
VQ=${VQ:-vgen/assets/shapes-t2i/vq}
JUDGE=${JUDGE:-vgen/assets/shapes-scene-judge}
JUDGE_RUN=${JUDGE_RUN:-runs/gpu-scene-judge}
NUM_IMAGES=${NUM_IMAGES:-96000}
JUDGE_STEPS=${JUDGE_STEPS:-0}
JUDGE_IMAGES=${JUDGE_IMAGES:-64000}
JUDGE_BATCH=${JUDGE_BATCH:-256}
JUDGE_MIN=${JUDGE_MIN:-1.5}
JUDGE_VAL=${JUDGE_VAL:-2048}
STEPS=${STEPS:-20000}
BATCH=${BATCH:-128}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-100}
EVAL_EVERY=${EVAL_EVERY:-1000}
NUM_EVAL=${NUM_EVAL:-512}
QUALITY_BATCH=${QUALITY_BATCH:-128}
CFG=${CFG:-3.0}
PRECISION=${PRECISION:-bf16}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
VGEN=(python3 -m vgen.apps.cli)

mkdir -p "$OUT" "$RUN"
result="$RUN/result"
rm -rf "$result" && mkdir -p "$result"
if [ "$JUDGE_STEPS" -gt 0 ]; then
    mkdir -p "$JUDGE_RUN"
    "${VGEN[@]}" train scene-judge --run-dir "$JUDGE_RUN" --data-dir "$DATA" --tokenizer "$VQ" \
        --num-images "$JUDGE_IMAGES" --num-val "$JUDGE_VAL" --batch-size "$JUDGE_BATCH" --steps "$JUDGE_STEPS" \
        --warmup-steps "$WARMUP" --max-minutes "$JUDGE_MIN" --device "$DEVICE" --precision "$PRECISION" 2>&1 \
        | tee -a "$OUT/train.log"
    tail -n 1 "$JUDGE_RUN/log.jsonl" | sed 's/^/scene judge (held out): /' >>"$OUT/summary.txt"
    cp "$JUDGE_RUN/log.jsonl" "$result/judge_log.jsonl"
    cp -r "$JUDGE_RUN/export" "$result/judge"
    JUDGE="$result/judge"
fi

train_until "$END_AT" "$STEPS" "$RUN" "${VGEN[@]}" train t2i --run-dir "$RUN" --data-dir "$DATA" --tokenizer "$VQ" \
    --init-from "$INIT" --num-images "$NUM_IMAGES" --batch-size "$BATCH" --lr "$LR" --warmup-steps "$WARMUP" \
    --eval-every "$EVAL_EVERY" --device "$DEVICE" --precision "$PRECISION" 2>&1 | tee -a "$OUT/train.log"
tail -n 1 "$RUN/log.jsonl" | sed 's/^/last logged step: /' >>"$OUT/summary.txt"

cp "$RUN/log.jsonl" "$result/t2i_log.jsonl"
"${VGEN[@]}" train package --gpt "$RUN/export/gpt" --text-encoder "$RUN/export/text_encoder" --vq "$VQ" \
    --out "$result/pipe" --name shapes-t2i --cfg-scale "$CFG" --dtype bf16

pack "$result" "$OUT" "$RUN"
if "${VGEN[@]}" quality --model "$result/pipe" --judge "$JUDGE" --num-images "$NUM_EVAL" \
    --batch-size "$QUALITY_BATCH" --device "$DEVICE" --json "$result/quality.json" --grid "$result/grid.png" \
    >"$result/quality.log" 2>&1; then
    python3 -c "import json, sys; q = json.load(open(sys.argv[1])); print('quality', {k: q[k] for k in (
        'attribute_accuracy', 'mean_entropy_nats', 'median_top1_prob')})" "$result/quality.json" \
        | tee -a "$OUT/summary.txt"
else
    echo "quality failed: $(tail -n 3 "$result/quality.log")" | tee -a "$OUT/summary.txt"
fi
pack "$result" "$OUT" "$RUN"
echo "done: $(ls "$OUT")"
