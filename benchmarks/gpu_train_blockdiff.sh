#!/usr/bin/env bash
# Train the streaming models (docs/models/shapes-blockdiff-cfg.md, shapes-blockdiff.md) for long horizons on one
# CUDA GPU in one call: continue the guided teacher on 16-frame clips (--clips 64px-16f: a model of 16 trained
# frames), distil it into the real-time student, package both and measure each on NUM_EVAL streams of EVAL_FRAMES
# frames, so that a device lent for 15 minutes spends them on training rather than setup.
#
#   bash benchmarks/gpu_train_blockdiff.sh
#
# The device renders the clips with all its cores and encodes them with the shipped KL tokenizer on the GPU (which
# needs diffusers: where the machine lacks it, carry its wheel and importlib_metadata's in .whl, as for
# gpu_train_continuous.sh). The teacher starts from INIT (the shipped teacher) and ends annealed TEACHER_END_S
# seconds after the script starts, the student (started from the new teacher, --distill-from at CFG TEACHER_CFG)
# TRAIN_END_S seconds after it, whatever the device's speed (train_until in gpu_pack.sh). Both are packaged in bf16
# with the shipped stream settings (the student: 3 steps, no CFG); a failed measurement still returns the weights.
# The device returns at most 8 files of at most 16 MiB each, so $OUT gets: train.log, summary.txt (each model's last
# logged step and class accuracy), and result.tar (teacher/, student/, their log.jsonl and quality.json) split into
# 15 MiB parts result.tar.part-NN with its sha256 in result.tar.sha256; `cat result.tar.part-* | tar -x` unpacks it.
#
# Environment (defaults): OUT (gpu_blockdiff_out), DEVICE (cuda), DATA (runs/clips64-16f), CLIPS (64px-16f), RUN
# (runs/gpu-blockdiff), INIT (vgen/assets/shapes-blockdiff-cfg/blockdiff), NUM_CLIPS (6000), STEPS (20000), BATCH
# (64), LR (3e-4), WARMUP (50), TEACHER_END_S (300), TRAIN_END_S (450), PROBE_S (45), TEACHER_CFG (5.0), WINDOW (4),
# NUM_EVAL (200), EVAL_FRAMES (16), QUALITY_BATCH (200), PRECISION (bf16), WHEELS (.whl), TEACHER_FLAGS and
# STUDENT_FLAGS (each run's recipe options; by default the shipped models' recipes).
# DEVICE=cpu with small counts is the dry run this script is tested by.
set -euo pipefail

cd "$(dirname "$0")/.."
source benchmarks/gpu_pack.sh
START=$(date +%s)
OUT=${OUT:-gpu_blockdiff_out}
DEVICE=${DEVICE:-cuda}
DATA=${DATA:-runs/clips64-16f}
CLIPS=${CLIPS:-64px-16f}
RUN=${RUN:-runs/gpu-blockdiff}
INIT=${INIT:-vgen/assets/shapes-blockdiff-cfg/blockdiff}
NUM_CLIPS=${NUM_CLIPS:-6000}
STEPS=${STEPS:-20000}
BATCH=${BATCH:-64}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-50}
TEACHER_CFG=${TEACHER_CFG:-5.0}
WINDOW=${WINDOW:-4}
NUM_EVAL=${NUM_EVAL:-200}
EVAL_FRAMES=${EVAL_FRAMES:-16}
QUALITY_BATCH=${QUALITY_BATCH:-200}
PRECISION=${PRECISION:-bf16}
# the shipped teacher's and student's recipe options (docs/streaming.md#training-vgen-train-blockdiff)
HARD_CLASSES="--class-repeats square=3 triangle=3"
read -r -a TEACHER_FLAGS <<<"${TEACHER_FLAGS:---noise-shift 3 --lone-block-share 0.5 $HARD_CLASSES}"
read -r -a STUDENT_FLAGS <<<"${STUDENT_FLAGS:---noise-shift 3 --lone-block-share 0.25 --rollout-share 0.5 $HARD_CLASSES}"
KL=vgen/assets/shapes-c2i-continuous/kl
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
use_carried_wheels
VGEN=(python3 -m vgen.apps.cli)
COMMON=(--tokenizer "$KL" --clips "$CLIPS" --data-dir "$DATA" --num-images "$NUM_CLIPS" --batch-size "$BATCH"
        --lr "$LR" --warmup-steps "$WARMUP" --device "$DEVICE" --precision "$PRECISION")

mkdir -p "$OUT" "$RUN/teacher" "$RUN/student"
result="$RUN/result"
rm -rf "$result" && mkdir -p "$result"

train_until $((START + ${TEACHER_END_S:-300})) "$STEPS" "$RUN/teacher" "${VGEN[@]}" train blockdiff \
    --run-dir "$RUN/teacher" --init-from "$INIT" "${COMMON[@]}" "${TEACHER_FLAGS[@]}" 2>&1 | tee -a "$OUT/train.log"
tail -n 1 "$RUN/teacher/log.jsonl" | sed 's/^/teacher, last logged step: /' >>"$OUT/summary.txt"
cp "$RUN/teacher"/train_clip_latents_*.npy "$RUN/student/" 2>/dev/null || true  # encoded once
train_until $((START + ${TRAIN_END_S:-450})) "$STEPS" "$RUN/student" "${VGEN[@]}" train blockdiff \
    --run-dir "$RUN/student" --distill-from "$RUN/teacher/export" --teacher-cfg "$TEACHER_CFG" "${COMMON[@]}" \
    "${STUDENT_FLAGS[@]}" 2>&1 | tee -a "$OUT/train.log"
tail -n 1 "$RUN/student/log.jsonl" | sed 's/^/student, last logged step: /' >>"$OUT/summary.txt"

declare -A SETTINGS=(
    [teacher]="{\"sink_frames\": 2, \"window_frames\": $WINDOW, \"cfg_scale\": $TEACHER_CFG}"
    [student]="{\"sink_frames\": 2, \"window_frames\": $WINDOW, \"cfg_scale\": 1.0, \"steps\": 3}"
)
declare -A NAMES=([teacher]=shapes-blockdiff-cfg [student]=shapes-blockdiff)
for model in teacher student; do
    cp "$RUN/$model/log.jsonl" "$result/${model}_log.jsonl"
    "${VGEN[@]}" train package --gpt "$RUN/$model/export" --vq "$KL" --data-dir "$DATA" --out "$result/$model" \
        --name "${NAMES[$model]}" --dtype bf16 --stream-defaults "${SETTINGS[$model]}"
done
pack "$result" "$OUT" "$RUN"

for model in teacher student; do
    if "${VGEN[@]}" quality --model "$result/$model" --num-images "$NUM_EVAL" --batch-size "$QUALITY_BATCH" \
        --num-frames "$EVAL_FRAMES" --device "$DEVICE" --no-progress --json "$result/${model}_quality.json" \
        >"$result/${model}_quality.log" 2>&1; then
        python3 -c "import json, sys; q = json.load(open(sys.argv[1])); print(sys.argv[2], {k: q[k] for k in (
            'class_accuracy', 'class_accuracy_by_chunk', 'collapsed', 'per_class') if k in q})" \
            "$result/${model}_quality.json" "$model" | tee -a "$OUT/summary.txt"
    else
        echo "$model quality failed: $(tail -n 3 "$result/${model}_quality.log")" | tee -a "$OUT/summary.txt"
    fi
done
pack "$result" "$OUT" "$RUN"
echo "done: $(ls "$OUT")"
