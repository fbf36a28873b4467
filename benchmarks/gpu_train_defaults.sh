#!/usr/bin/env bash
# Continue training the two embedded defaults that a GPU helps most, side by side on one CUDA GPU in one call: the
# prompt default (benchmarks/gpu_train_t2i.sh) and the continuous default's target
# (benchmarks/gpu_train_continuous.sh). Neither small model fills the GPU, so the two share it; each renders its
# data on the machine's cores first (on an H200 machine the t2i run, rendering beside the other, ended its 45 s
# probe 199 s after the start), and the continuous run needs diffusers' wheel carried where the machine lacks it.
#
#   bash benchmarks/gpu_train_defaults.sh
#
# Each script runs with OUT, RUN and DATA under WORK/<name>/ and ends its training TRAIN_END_S seconds after the
# start (the text-to-image model T2I_END_S); other settings (DEVICE, PRECISION, BATCH, ...) pass through to both.
# When both are done, or at DEADLINE_S seconds, whatever they wrote is packed into $OUT as one result.tar in
# 15 MiB parts (gpu_pack.sh), with summary.txt (each script's exit status and summary), so that a device's limit
# of 8 returned files holds both. `cat result.tar.part-* | tar -x` gives t2i/ and continuous/, each with
# script.log, train.log, summary.txt and its own result.tar parts.
#
# Environment (defaults): OUT (gpu_defaults_out), WORK (runs/gpu-defaults), T2I_END_S (470), TRAIN_END_S (460),
# DEADLINE_S (545), T2I_SCRIPT (benchmarks/gpu_train_t2i.sh), CONTINUOUS_SCRIPT (benchmarks/gpu_train_continuous.sh).
# DEVICE=cpu with small counts is a dry run of the whole.
set -uo pipefail

cd "$(dirname "$0")/.."
source benchmarks/gpu_pack.sh
OUT=${OUT:-gpu_defaults_out}
WORK=${WORK:-runs/gpu-defaults}
T2I_END_S=${T2I_END_S:-470}
TRAIN_END_S=${TRAIN_END_S:-460}
DEADLINE_S=${DEADLINE_S:-545}
mkdir -p "$OUT"

declare -A PIDS
start() {  # start NAME SCRIPT END_S: the script in the background, its files in WORK/NAME/files
    local dir="$WORK/$1"
    mkdir -p "$dir/files"
    OUT="$dir/files" RUN="$dir/run" DATA="$dir/data" TRAIN_END_S="$3" bash "$2" >"$dir/files/script.log" 2>&1 &
    PIDS[$1]=$!
}
start t2i "${T2I_SCRIPT:-benchmarks/gpu_train_t2i.sh}" "$T2I_END_S"
start continuous "${CONTINUOUS_SCRIPT:-benchmarks/gpu_train_continuous.sh}" "$TRAIN_END_S"

while [ "$SECONDS" -lt "$DEADLINE_S" ] && { kill -0 "${PIDS[t2i]}" || kill -0 "${PIDS[continuous]}"; } 2>/dev/null; do
    sleep 2
done
collected="$WORK/collected"
rm -rf "$collected" && mkdir -p "$collected"
: >"$OUT/summary.txt"
for name in t2i continuous; do
    if kill -0 "${PIDS[$name]}" 2>/dev/null; then
        status="still running at ${DEADLINE_S}s"
    else
        wait "${PIDS[$name]}"
        status="exit $?"
    fi
    { echo "== $name ($status)"; cat "$WORK/$name/files/summary.txt" 2>/dev/null; } >>"$OUT/summary.txt"
    cp -r "$WORK/$name/files" "$collected/$name"
done
pack "$collected" "$OUT" "$WORK"
cat "$OUT/summary.txt"
echo "done in ${SECONDS}s: $(ls "$OUT")"
