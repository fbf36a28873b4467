#!/usr/bin/env bash
# Train the prompt-conditioned streaming models (docs/models/shapes-t2v-stream.md) on one CUDA GPU in one call:
# fine-tune the KL tokenizer on moving-scene frames (unless KL names a tuned one), train the guided text teacher from
# the shipped class teacher, distil it into the real-time student on its own streams with prompt switches, and
# package both, so that a device lent for 15 minutes spends them on training rather than setup.
#
#   bash benchmarks/gpu_train_t2v.sh
#
# The device renders the moving scenes with all its cores and encodes them on the GPU (the KL tokenizer needs
# diffusers: where the machine lacks it, carry its wheel and importlib_metadata's in .whl, as for
# gpu_train_continuous.sh). Each run ends annealed at its deadline, counted in seconds from the script's start,
# whatever the device's speed (train_until in gpu_pack.sh): the KL fine-tune at KL_END_S, the teacher (from INIT,
# its encoder's known words' rows from shapes-t2i's) at TEACHER_END_S, the student (--distill-from the new teacher
# at CFG TEACHER_CFG) at TRAIN_END_S. Both are packaged in bf16 with their text encoder and the tuned KL tokenizer
# (the teacher streams at CFG TEACHER_CFG, the student at CFG 1 in 3 steps).
# The device returns at most 8 files of at most 16 MiB each, so $OUT gets: train.log, summary.txt (each run's last
# logged step), and result.tar (kl/, teacher/, student/ and their log.jsonl) split into 15 MiB parts
# result.tar.part-NN with its sha256 in result.tar.sha256; `cat result.tar.part-* | tar -x` unpacks it.
#
# Environment (defaults): OUT (gpu_t2v_out), DEVICE (cuda), DATA (runs/moving-scenes), RUN (runs/gpu-t2v), INIT
# (vgen/assets/shapes-blockdiff-cfg), KL (empty: fine-tune KL_INIT, vgen/assets/shapes-blockdiff-cfg/kl, on
# KL_CLIPS (2000) clips for at most KL_STEPS (1500) steps of KL_BATCH (64)), NUM_CLIPS (24000), STEPS (20000),
# BATCH (64), LR (3e-4), WARMUP (50), KL_END_S (100), TEACHER_END_S (300), TRAIN_END_S (450), PROBE_S (45),
# TEACHER_CFG (3.0), WINDOW (4), PRECISION (bf16), WHEELS (.whl), TEACHER_FLAGS and STUDENT_FLAGS (each run's
# recipe options).
# DEVICE=cpu with small counts is the dry run this script is tested by.
set -euo pipefail

cd "$(dirname "$0")/.."
source benchmarks/gpu_pack.sh
START=$(date +%s)
OUT=${OUT:-gpu_t2v_out}
DEVICE=${DEVICE:-cuda}
DATA=${DATA:-runs/moving-scenes}
RUN=${RUN:-runs/gpu-t2v}
INIT=${INIT:-vgen/assets/shapes-blockdiff-cfg}
KL=${KL:-}
KL_INIT=${KL_INIT:-vgen/assets/shapes-blockdiff-cfg/kl}
KL_CLIPS=${KL_CLIPS:-2000}
KL_STEPS=${KL_STEPS:-1500}
KL_BATCH=${KL_BATCH:-64}
NUM_CLIPS=${NUM_CLIPS:-24000}
STEPS=${STEPS:-20000}
BATCH=${BATCH:-64}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-50}
TEACHER_CFG=${TEACHER_CFG:-3.0}
WINDOW=${WINDOW:-4}
PRECISION=${PRECISION:-bf16}
read -r -a TEACHER_FLAGS <<<"${TEACHER_FLAGS:---noise-shift 3 --lone-block-share 0.5}"
read -r -a STUDENT_FLAGS <<<"${STUDENT_FLAGS:---noise-shift 3 --lone-block-share 0.25 --rollout-share 0.5 --switch-share 0.25}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
use_carried_wheels
VGEN=(python3 -m vgen.apps.cli)
RUNTIME=(--data-dir "$DATA" --device "$DEVICE" --precision "$PRECISION" --warmup-steps "$WARMUP")

mkdir -p "$OUT" "$RUN/teacher" "$RUN/student"
result="$RUN/result"
rm -rf "$result" && mkdir -p "$result"

if [ -z "$KL" ]; then
    train_until $((START + ${KL_END_S:-100})) "$KL_STEPS" "$RUN/kl" "${VGEN[@]}" train t2v-kl --run-dir "$RUN/kl" \
        --tokenizer "$KL_INIT" --num-images "$KL_CLIPS" --batch-size "$KL_BATCH" --lr 3e-4 "${RUNTIME[@]}" \
        2>&1 | tee -a "$OUT/train.log"
    tail -n 1 "$RUN/kl/log.jsonl" | sed 's/^/kl, last logged step: /' >>"$OUT/summary.txt"
    KL="$RUN/kl/export"
fi
COMMON=(--tokenizer "$KL" --num-images "$NUM_CLIPS" --batch-size "$BATCH" --lr "$LR" "${RUNTIME[@]}")

train_until $((START + ${TEACHER_END_S:-300})) "$STEPS" "$RUN/teacher" "${VGEN[@]}" train t2v-stream \
    --run-dir "$RUN/teacher" --init-from "$INIT" "${COMMON[@]}" "${TEACHER_FLAGS[@]}" 2>&1 | tee -a "$OUT/train.log"
tail -n 1 "$RUN/teacher/log.jsonl" | sed 's/^/teacher, last logged step: /' >>"$OUT/summary.txt"
cp "$RUN/teacher"/moving_latents_*.npy "$RUN/student/" 2>/dev/null || true  # encoded once
train_until $((START + ${TRAIN_END_S:-450})) "$STEPS" "$RUN/student" "${VGEN[@]}" train t2v-stream \
    --run-dir "$RUN/student" --distill-from "$RUN/teacher/export" --teacher-cfg "$TEACHER_CFG" "${COMMON[@]}" \
    "${STUDENT_FLAGS[@]}" 2>&1 | tee -a "$OUT/train.log"
tail -n 1 "$RUN/student/log.jsonl" | sed 's/^/student, last logged step: /' >>"$OUT/summary.txt"

declare -A SETTINGS=(
    [teacher]="{\"sink_frames\": 2, \"window_frames\": $WINDOW, \"cfg_scale\": $TEACHER_CFG}"
    [student]="{\"sink_frames\": 2, \"window_frames\": $WINDOW, \"cfg_scale\": 1.0, \"steps\": 3}"
)
declare -A NAMES=([teacher]=shapes-t2v-stream-cfg [student]=shapes-t2v-stream)
cp -r "$KL" "$result/kl"
for model in teacher student; do
    cp "$RUN/$model/log.jsonl" "$result/${model}_log.jsonl"
    "${VGEN[@]}" train package --gpt "$RUN/$model/export/blockdiff" --vq "$KL" \
        --text-encoder "$RUN/$model/export/text_encoder" --out "$result/$model" --name "${NAMES[$model]}" \
        --dtype bf16 --stream-defaults "${SETTINGS[$model]}"
done
pack "$result" "$OUT" "$RUN"
echo "done: $(ls "$OUT")"
