#!/usr/bin/env bash
# Train a video token model on one CUDA GPU in one call, package it and measure it on 200 clips, so that a device
# lent for 15 minutes spends them on training rather than setup. KIND picks the model: nar (docs/models/
# shapes-video-nar.md) or nbp (docs/models/shapes-video-nbp.md; from the shipped 8-frame model, carried 16-frame
# codes train a model of 16 frames, docs/video.md#a-model-of-16-frames).
#
#   CARRY=runs/device bash benchmarks/gpu_train_video.sh
#   KIND=nbp CARRY=runs/device16 bash benchmarks/gpu_train_video.sh
#
# CARRY holds what the run reads instead of rendering and tokenising clips (neither fits the device time):
# clips.json (the clips' config, as `vgen train --clips 64px` or `--clips 64px-16f` writes it; the run trains on
# that geometry) and train_clip_codes_<N>.npy (N clips tokenised by shapes-c2i/vq, as a run folder of `vgen train
# nar --video` or `vgen train nbp` on those clips holds it). Steps: train for TRAIN_MIN minutes (the cosine schedule
# of STEPS steps is cut there; a second call on the still-warm machine resumes the same run folder), export,
# package in bf16, then `vgen quality` on NUM_CLIPS clips at each temperature:top-k pair of SAMPLINGS (top-k 0 is
# off; the first pair is stored as the package's default). The device returns at most 8 files of at most 16 MiB
# each, so $OUT gets five: train.log, summary.txt (the quality figures), and result.tar (log.jsonl, pipe/,
# quality_t<T>_k<K>.json and .log, grid_t<T>_k<K>.png) split into 15 MiB parts result.tar.part-NN with its sha256
# in result.tar.sha256; `cat result.tar.part-* | tar -x` unpacks it. The package is packed before it is measured,
# so a failed measurement still returns the weights.
#
# Environment (defaults for KIND=nar / KIND=nbp): KIND (nar), OUT (gpu_video_<KIND>_out), CARRY (runs/device), DEVICE
# (cuda), INIT (vgen/assets/shapes-video-<KIND>/gpt), LAYOUT (nar only: image-first, or 3d), TRAIN_MIN (5.5), STEPS
# (3000), BATCH (32), LR (1e-3 / 3e-4), WARMUP (100 / 50), EVAL_EVERY (1000), NUM_CLIPS (200), QUALITY_BATCH (40),
# SAMPLINGS ("0.9:0 1.0:0", the shipped NAR package's sampling and NBP's / "1.0:0"), FIRST_FRAMES (2), PRECISION
# (bf16), RUN (runs/gpu-video-<KIND>). DEVICE=cpu with small STEPS, BATCH and NUM_CLIPS is the dry run this script
# is tested by.
set -euo pipefail

cd "$(dirname "$0")/.."
source benchmarks/gpu_pack.sh
KIND=${KIND:-nar}
case $KIND in
    nar) lr=1e-3 warmup=100 samplings="0.9:0 1.0:0" ;;
    nbp) lr=3e-4 warmup=50 samplings="1.0:0" ;;
    *) echo "KIND must be nar or nbp, got $KIND" >&2; exit 2 ;;
esac
OUT=${OUT:-gpu_video_${KIND}_out}
CARRY=${CARRY:-runs/device}
DEVICE=${DEVICE:-cuda}
INIT=${INIT:-vgen/assets/shapes-video-$KIND/gpt}
LAYOUT=${LAYOUT:-image-first}
TRAIN_MIN=${TRAIN_MIN:-5.5}
STEPS=${STEPS:-3000}
BATCH=${BATCH:-32}
LR=${LR:-$lr}
WARMUP=${WARMUP:-$warmup}
EVAL_EVERY=${EVAL_EVERY:-1000}
NUM_CLIPS=${NUM_CLIPS:-200}
QUALITY_BATCH=${QUALITY_BATCH:-40}
SAMPLINGS=${SAMPLINGS:-$samplings}
FIRST_FRAMES=${FIRST_FRAMES:-2}
PRECISION=${PRECISION:-bf16}
VQ=vgen/assets/shapes-video-$KIND/vq
RUN=${RUN:-runs/gpu-video-$KIND}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
VGEN=(python3 -m vgen.apps.cli)

shopt -s nullglob
found=("$CARRY"/train_clip_codes_*.npy)
if [ ! -f "$CARRY/clips.json" ] || [ ${#found[@]} != 1 ]; then
    echo "CARRY=$CARRY needs clips.json and one train_clip_codes_<N>.npy, found ${#found[@]} codes files" \
        "(see the header of $0)" >&2
    exit 2
fi
codes=${found[0]}
num_clips=$(basename "$codes" .npy)
num_clips=${num_clips##*_}
case $KIND:$LAYOUT in
    nar:image-first) recipe=(nar --video --image-first --first-frames "$FIRST_FRAMES") ;;
    nar:3d) recipe=(nar --video) ;;
    nar:*) echo "LAYOUT must be image-first or 3d, got $LAYOUT" >&2; exit 2 ;;
    nbp:*) recipe=(nbp --first-frames "$FIRST_FRAMES") ;;
esac
mkdir -p "$OUT" "$RUN"
[ -f "$RUN/$(basename "$codes")" ] || cp "$codes" "$RUN/"

"${VGEN[@]}" train "${recipe[@]}" --run-dir "$RUN" --tokenizer "$VQ" --data-dir "$CARRY" --init-from "$INIT" \
    --num-images "$num_clips" --batch-size "$BATCH" --lr "$LR" --warmup-steps "$WARMUP" --steps "$STEPS" \
    --max-minutes "$TRAIN_MIN" --eval-every "$EVAL_EVERY" --device "$DEVICE" --precision "$PRECISION" 2>&1 |
    tee -a "$OUT/train.log"

read -r -a samplings <<<"$SAMPLINGS"
result="$RUN/result"
rm -rf "$result" && mkdir -p "$result"
[ ! -f "$RUN/log.jsonl" ] || cp "$RUN/log.jsonl" "$result/"  # written every 25 steps
"${VGEN[@]}" train package --gpt "$RUN/export" --vq "$VQ" --data-dir "$CARRY" --out "$result/pipe" \
    --name "shapes-video-$KIND" --cfg-scale 3.0 --temperature "${samplings[0]%%:*}" --top-k "${samplings[0]##*:}" \
    --dtype bf16

pack "$result" "$OUT" "$RUN"
for pair in "${samplings[@]}"; do
    t=${pair%%:*} k=${pair##*:}
    name="t${t}_k$k"
    if "${VGEN[@]}" quality --model "$result/pipe" --num-images "$NUM_CLIPS" --batch-size "$QUALITY_BATCH" \
        --temperature "$t" --top-k "$k" --device "$DEVICE" --json "$result/quality_$name.json" \
        --grid "$result/grid_$name.png" >"$result/quality_$name.log" 2>&1; then
        python3 -c "import json, sys; q = json.load(open(sys.argv[1])); print(sys.argv[2], {k: q[k] for k in (
            'class_accuracy', 'class_accuracy_by_chunk', 'frame_accuracy', 'share_above_real_p95', 'share_moving')
            if k in q})" "$result/quality_$name.json" "quality_$name" | tee -a "$OUT/summary.txt"
    else
        echo "quality_$name failed: $(tail -n 3 "$result/quality_$name.log")" | tee -a "$OUT/summary.txt"
    fi
done
pack "$result" "$OUT" "$RUN"
echo "done: $(ls "$OUT")"
