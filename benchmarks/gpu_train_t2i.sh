#!/usr/bin/env bash
# Train the prompt-driven shapes-t2i model and its scene judge on one CUDA GPU in one call (docs/models/shapes-t2i.md),
# package the model and measure its prompt faithfulness, so that a device lent for 15 minutes spends them on
# training rather than setup.
#
#   bash benchmarks/gpu_train_t2i.sh
#
# Nothing needs carrying: the device renders the captioned scenes with all its cores and tokenises them on the GPU.
# Steps: train the scene judge for JUDGE_MIN minutes (vgen train scene-judge), then the text encoder and image model
# for TRAIN_MIN minutes from the shapes-c2i weights (vgen train t2i; the cosine schedule of STEPS steps is cut
# there, and a second call on the still-warm machine resumes both runs), package in bf16 with the judge beside it,
# then `vgen quality` on NUM_EVAL held-out prompts. The device returns at most 8 files of at most 16 MiB each, so
# $OUT gets: train.log, summary.txt (the judge's held-out accuracy and the quality figures), and result.tar
# (pipe/, judge/, the two log.jsonl, quality.json, grid.png) split into 15 MiB parts result.tar.part-NN with its
# sha256 in result.tar.sha256; `cat result.tar.part-* | tar -x` unpacks it. The package is packed before it is
# measured, so a failed measurement still returns the weights.
#
# Environment (defaults): OUT (gpu_t2i_out), DEVICE (cuda), DATA (runs/data-scenes), RUN (runs/gpu-t2i), JUDGE_RUN
# (runs/gpu-scene-judge), NUM_IMAGES (96000), JUDGE_IMAGES (64000), JUDGE_VAL (2048), JUDGE_STEPS (3000),
# JUDGE_BATCH (256), JUDGE_MIN (1.5), STEPS (6000), BATCH (128), LR (5e-4), WARMUP (100), TRAIN_MIN (6), EVAL_EVERY
# (1000), NUM_EVAL (512), QUALITY_BATCH (128), CFG (3.0), PRECISION (bf16). DEVICE=cpu with small counts is the
# dry run this script is tested by.
set -euo pipefail

cd "$(dirname "$0")/.."
source benchmarks/gpu_pack.sh
OUT=${OUT:-gpu_t2i_out}
DEVICE=${DEVICE:-cuda}
DATA=${DATA:-runs/data-scenes}
RUN=${RUN:-runs/gpu-t2i}
JUDGE_RUN=${JUDGE_RUN:-runs/gpu-scene-judge}
NUM_IMAGES=${NUM_IMAGES:-96000}
JUDGE_IMAGES=${JUDGE_IMAGES:-64000}
JUDGE_STEPS=${JUDGE_STEPS:-3000}
JUDGE_BATCH=${JUDGE_BATCH:-256}
JUDGE_MIN=${JUDGE_MIN:-1.5}
JUDGE_VAL=${JUDGE_VAL:-2048}
STEPS=${STEPS:-6000}
BATCH=${BATCH:-128}
LR=${LR:-5e-4}
WARMUP=${WARMUP:-100}
TRAIN_MIN=${TRAIN_MIN:-6}
EVAL_EVERY=${EVAL_EVERY:-1000}
NUM_EVAL=${NUM_EVAL:-512}
QUALITY_BATCH=${QUALITY_BATCH:-128}
CFG=${CFG:-3.0}
PRECISION=${PRECISION:-bf16}
VQ=vgen/assets/shapes-c2i/vq
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
VGEN=(python3 -m vgen.apps.cli)

mkdir -p "$OUT" "$RUN" "$JUDGE_RUN"
"${VGEN[@]}" train scene-judge --run-dir "$JUDGE_RUN" --data-dir "$DATA" --tokenizer "$VQ" \
    --num-images "$JUDGE_IMAGES" --num-val "$JUDGE_VAL" --batch-size "$JUDGE_BATCH" --steps "$JUDGE_STEPS" \
    --warmup-steps "$WARMUP" --max-minutes "$JUDGE_MIN" --device "$DEVICE" --precision "$PRECISION" 2>&1 | tee -a "$OUT/train.log"
tail -n 1 "$JUDGE_RUN/log.jsonl" | sed 's/^/scene judge (held out): /' >>"$OUT/summary.txt"

"${VGEN[@]}" train t2i --run-dir "$RUN" --data-dir "$DATA" --tokenizer "$VQ" --num-images "$NUM_IMAGES" \
    --batch-size "$BATCH" --lr "$LR" --warmup-steps "$WARMUP" --steps "$STEPS" --max-minutes "$TRAIN_MIN" \
    --eval-every "$EVAL_EVERY" --device "$DEVICE" --precision "$PRECISION" 2>&1 | tee -a "$OUT/train.log"

result="$RUN/result"
rm -rf "$result" && mkdir -p "$result"
cp "$RUN/log.jsonl" "$result/t2i_log.jsonl"
cp "$JUDGE_RUN/log.jsonl" "$result/judge_log.jsonl"
cp -r "$JUDGE_RUN/export" "$result/judge"
"${VGEN[@]}" train package --gpt "$RUN/export/gpt" --text-encoder "$RUN/export/text_encoder" --vq "$VQ" \
    --out "$result/pipe" --name shapes-t2i --cfg-scale "$CFG" --dtype bf16

pack "$result" "$OUT" "$RUN"
if "${VGEN[@]}" quality --model "$result/pipe" --judge "$result/judge" --num-images "$NUM_EVAL" \
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
