#!/usr/bin/env bash
# Continue training the continuous default's target (shapes-c2i-continuous, docs/models/shapes-c2i-continuous.md)
# on one CUDA GPU in one call, package it with the shipped KL tokenizer and draft, and measure its class accuracy,
# so that a device lent for 15 minutes spends them on training rather than setup.
#
#   bash benchmarks/gpu_train_continuous.sh
#
# The device renders the smooth shapes images with all its cores (32,000: 3 min 55 s on an H200 machine's 16,
# beside another run) and encodes them with the shipped KL tokenizer, which needs diffusers: where the machine
# lacks it, carry its wheel and importlib_metadata's in .whl (WHEELS; `pip download --no-deps --only-binary=:all:
# -d .whl diffusers==0.42.1 importlib_metadata`), which use_carried_wheels (gpu_pack.sh) installs first. The run
# starts from the shipped target (vgen train mar --init-from the pipeline) and ends annealed TRAIN_END_S seconds
# after the script starts at whatever speed the device runs (train_until in gpu_pack.sh: a probe of PROBE_S
# seconds, then the cosine laid over the steps that fit, at most STEPS), with the shipped recipe's class repeats
# (HARD_CLASSES). Then it packages in bf16 with the shipped sampling defaults (CFG, TEMPERATURE) and runs `vgen
# quality` on NUM_EVAL samples (the classes in turn). The device returns at most 8 files of at most 16 MiB each,
# so $OUT gets: train.log, summary.txt (the last loss and the class accuracy), and result.tar (pipe/, log.jsonl,
# quality.json, grid.png) split into 15 MiB parts result.tar.part-NN with its sha256 in result.tar.sha256; `cat
# result.tar.part-* | tar -x` unpacks it. The package is packed before it is measured, so a failed measurement
# still returns the weights.
#
# Environment (defaults): OUT (gpu_continuous_out), DEVICE (cuda), DATA (runs/data-smooth), RUN
# (runs/gpu-continuous), NUM_IMAGES (32000), STEPS (20000), BATCH (128), LR (3e-4), WARMUP (100), TRAIN_END_S
# (420), PROBE_S (45), NUM_EVAL (256), QUALITY_BATCH (128), CFG (3.0), TEMPERATURE (0.7), HARD_CLASSES
# (square=3 triangle=3 heart=2), PRECISION (bf16), WHEELS (.whl).
# DEVICE=cpu with small counts is the dry run this script is tested by.
set -euo pipefail

cd "$(dirname "$0")/.."
source benchmarks/gpu_pack.sh
END_AT=$(($(date +%s) + ${TRAIN_END_S:-420}))
OUT=${OUT:-gpu_continuous_out}
DEVICE=${DEVICE:-cuda}
DATA=${DATA:-runs/data-smooth}
RUN=${RUN:-runs/gpu-continuous}
NUM_IMAGES=${NUM_IMAGES:-32000}
STEPS=${STEPS:-20000}
BATCH=${BATCH:-128}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-100}
NUM_EVAL=${NUM_EVAL:-256}
QUALITY_BATCH=${QUALITY_BATCH:-128}
CFG=${CFG:-3.0}
TEMPERATURE=${TEMPERATURE:-0.7}
read -r -a HARD_CLASSES <<<"${HARD_CLASSES:-square=3 triangle=3 heart=2}"
PRECISION=${PRECISION:-bf16}
SHIPPED=vgen/assets/shapes-c2i-continuous
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
use_carried_wheels
VGEN=(python3 -m vgen.apps.cli)

mkdir -p "$OUT" "$RUN"
train_until "$END_AT" "$STEPS" "$RUN" "${VGEN[@]}" train mar --size target --run-dir "$RUN" --data-dir "$DATA" \
    --background smooth --tokenizer "$SHIPPED/kl" --init-from "$SHIPPED" --num-images "$NUM_IMAGES" \
    --batch-size "$BATCH" --lr "$LR" --warmup-steps "$WARMUP" --eval-every 0 --device "$DEVICE" \
    --precision "$PRECISION" --class-repeats "${HARD_CLASSES[@]}" 2>&1 | tee -a "$OUT/train.log"
tail -n 1 "$RUN/log.jsonl" | sed 's/^/last logged step: /' >>"$OUT/summary.txt"

result="$RUN/result"
rm -rf "$result" && mkdir -p "$result"
cp "$RUN/log.jsonl" "$result/log.jsonl"
"${VGEN[@]}" train package --gpt "$RUN/export" --vq "$SHIPPED/kl" --drafter "$SHIPPED/drafter" --data-dir "$DATA" \
    --out "$result/pipe" --name shapes-c2i-continuous --cfg-scale "$CFG" \
    --temperature "$TEMPERATURE" --dtype bf16

pack "$result" "$OUT" "$RUN"
if "${VGEN[@]}" quality --model "$result/pipe" --num-images "$NUM_EVAL" --batch-size "$QUALITY_BATCH" \
    --device "$DEVICE" --no-progress --json "$result/quality.json" --grid "$result/grid.png" \
    >"$result/quality.log" 2>&1; then
    python3 -c "import json, sys; q = json.load(open(sys.argv[1])); print('quality', {k: q[k] for k in (
        'class_accuracy', 'per_class')})" "$result/quality.json" | tee -a "$OUT/summary.txt"
else
    echo "quality failed: $(tail -n 3 "$result/quality.log")" | tee -a "$OUT/summary.txt"
fi
pack "$result" "$OUT" "$RUN"
echo "done: $(ls "$OUT")"
