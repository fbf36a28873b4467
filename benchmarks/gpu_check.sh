#!/usr/bin/env bash
# vgen on a CUDA machine in one run: the environment, the GPU tests (pytest -m gpu), the Triton kernels' speed
# against their torch references, and the samplers' speed (vanilla AR vs SJD / LANTERN / GSD on the embedded
# shapes-c2i model; ARSampler eager vs compiled with CUDA graphs on a random GPT-B).
#
#   bash benchmarks/gpu_check.sh                  # every default step, in order
#   bash benchmarks/gpu_check.sh kernels ar       # only these steps (a rerun skips what passed)
#
# Steps: env, tests, kernels, speculative, ar (the default set) and, not in the default set: extra (a batch-8
# speculative table in bf16 and ARSampler compile="default" on GPT-B), compiled (benchmarks/compiled_speed.py: every
# speculative sampler and vanilla AR, eager and under CUDA graphs, bf16, batch 1 and 8, on the embedded default
# and on a random GPT-B; tables in $OUT/compiled_{default,gptb}/), t2i_speed (benchmarks/t2i_speed.py: AR vs
# mcsjd / lantern on random LlamaGen-T2I GPT-XL and Janus-Pro-1B sized models, bf16, batch 1 and 8, tables in
# $OUT/t2i_speed.json and .md), t2i_mllm (the same script on random Emu3-Gen and Lumina-mGPT-7B sized models, the
# two with fixed tokens among their codes: bf16, batch 1 and 4, their first T2I_MLLM_ROWS rows of codes (6; "" for
# all), with the peak memory of each; tables in $OUT/t2i_mllm/), t2i_tests (the text-to-image parity tests;
# benchmarks/gpu_check_t2i.sh runs the three) and tree (benchmarks/tree_speed.py: the cost curve of a draft-tree
# forward and the planner's pass cost fitted to it, nodes free up to its knee and node cost past it, then compiled AR
# and MC-SJD against the tree sampler at that pass cost and at node cost 0.001, bf16, batch 1 and 8, on the embedded default and a random LlamaGen-T2I GPT-XL; tables in $OUT/tree_speed/,
# rewritten after each measurement; its compilations take most of the budget: run it alone).
# Each step writes $OUT/<step>.log and a line to $OUT/summary.log; a failing or timed-out step does not
# stop the others. Every step has its own time limit and the whole run keeps within BUDGET_S seconds (steps that
# would start too late are skipped, and say so).
# Environment: PYTHON (python3), OUT (gpu_check_out), BUDGET_S (540), GPU_TEST_WORKERS (4, pytest-xdist workers
# when xdist imports; 0 runs the tests in one process), T2I_TEST_WORKERS (8, the same for t2i_tests, which run on
# the CPU), T2I_SPEED_ARGS (more arguments of t2i_speed, e.g. "--tiny --device cpu" for a dry run), COMPILED_ARGS
# (more arguments of both compiled_speed runs, e.g. "--gpt-model tiny --device cpu" for a dry run), TREE_SPEED_ARGS
# (more arguments of tree_speed, e.g. "--tiny --device cpu --compile-mode none" for a dry run). Exit status:
# the number of step commands that did not pass.
set -u

cd "$(dirname "$0")/.." || exit 99
PYTHON=${PYTHON:-python3}
OUT=${OUT:-gpu_check_out}
BUDGET_S=${BUDGET_S:-540}
GPU_TEST_WORKERS=${GPU_TEST_WORKERS:-4}
T2I_TEST_WORKERS=${T2I_TEST_WORKERS:-8}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
SUMMARY="$OUT/summary.log"
FAILED=0
STEP=""

note() {  # a line in the step's log and on the console
    echo "$*" | tee -a "$OUT/$STEP.log"
}

run() {  # run LIMIT_S COMMAND...: time-limited, output teed into the step's log; never stops the script
    local limit=$1
    shift
    local left=$((BUDGET_S - SECONDS - 5))
    if [ "$left" -lt 20 ]; then
        note "=== SKIPPED (the run's budget of ${BUDGET_S}s is spent): $*"
        printf '%-12s %-26s %5ss  %s\n' "$STEP" "SKIPPED (no time left)" 0 "$*" >>"$SUMMARY"
        FAILED=$((FAILED + 1))
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    note "=== $(date +%T) [$STEP] $* (limit ${limit}s)"
    local start=$SECONDS
    timeout --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$OUT/$STEP.log"
    local rc=${PIPESTATUS[0]} took=$((SECONDS - start)) verdict=ok
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        verdict="TIMED OUT after ${limit}s"
    elif [ "$rc" != 0 ]; then
        verdict="FAILED (exit $rc)"
    fi
    [ "$verdict" = ok ] || FAILED=$((FAILED + 1))
    note "=== $verdict in ${took}s [$STEP] $*"
    printf '%-12s %-26s %5ss  %s\n' "$STEP" "$verdict" "$took" "$*" >>"$SUMMARY"
}

step_env() {
    if command -v nvidia-smi >/dev/null; then
        run 30 nvidia-smi -L
        run 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    else
        note "nvidia-smi is not on PATH"
    fi
    run 60 "$PYTHON" - <<'EOF'
import importlib.metadata as md
import platform
import sys

import torch

print("python", sys.version.split()[0], platform.platform())
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
    x = torch.randn(256, 256, device="cuda")
    print("cuda matmul ok:", bool(torch.allclose((x @ x).cpu(), x.cpu() @ x.cpu(), rtol=1e-3, atol=1e-3)),
          "| free / total GiB: %.1f / %.1f" % tuple(v / 2**30 for v in torch.cuda.mem_get_info()))
import os
import shutil
import sysconfig

# Triton builds its launcher with a C compiler against Python's headers at the first kernel launch
print("C compiler:", os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), "NONE"),
      "| Python.h:", os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
for name in ("triton", "numpy", "pytest", "pytest-xdist", "einops", "safetensors", "pillow", "imageio", "tqdm",
             "scipy", "torchmetrics", "diffusers", "imageio-ffmpeg", "gradio"):
    try:
        print(f"{name:14s} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name:14s} MISSING")
EOF
    run 60 "$PYTHON" -c 'import vgen; print("import vgen:", vgen.__file__, vgen.available_models())'
}

step_tests() {
    local files workers=()
    files=$(grep -rl --include='*.py' 'pytest.mark.gpu' tests | sort)
    note "GPU test files: $(echo "$files" | tr '\n' ' ')"
    if [ "$GPU_TEST_WORKERS" != 0 ] && "$PYTHON" -c 'import xdist' 2>/dev/null; then
        workers=(-n "$GPU_TEST_WORKERS")
    fi
    # -m gpu: only the GPU tests, so that tests/kernels/conftest.py leaves Triton's interpreter off
    # shellcheck disable=SC2086
    run 330 "$PYTHON" -m pytest -m gpu -p no:cacheprovider -q -rfEs --durations=15 "${workers[@]}" $files
}

step_kernels() {
    run 180 "$PYTHON" benchmarks/kernel_speed.py
}

step_speculative() {
    # batch 1 (latency), fp32; the k-token forward cost curve first
    run 240 "$PYTHON" benchmarks/speculative_speed.py --device cuda --dtype fp32 --num-images 16 --batch-size 1 \
        --num-real 256 --samplers ar,sjd,mcsjd,lantern,gsd --cost-repeats 20
}

step_ar() {
    run 270 "$PYTHON" benchmarks/ar_speed.py --device cuda --gpt-model GPT-B --tokens 256 --batch 8 --cfg-scale 4.0 \
        --top-k 2000 --dtype bf16 --no-naive --compile reduce-overhead --repeats 3
}

step_extra() {
    run 240 "$PYTHON" benchmarks/speculative_speed.py --device cuda --dtype bf16 --num-images 32 --batch-size 8 \
        --num-real 256 --samplers ar,sjd,mcsjd,lantern,gsd --windows 1 8 16 32 --cost-repeats 10
    run 240 "$PYTHON" benchmarks/ar_speed.py --device cuda --gpt-model GPT-B --tokens 256 --batch 8 --cfg-scale 4.0 \
        --top-k 2000 --dtype bf16 --no-naive --compile default --repeats 3
}

step_compiled() {
    # shellcheck disable=SC2086
    run 300 "$PYTHON" benchmarks/compiled_speed.py --device cuda --dtype bf16 --batch-sizes 1 8 --repeats 3 \
        --out "$OUT/compiled_default" ${COMPILED_ARGS:-}
    # shellcheck disable=SC2086
    run 240 "$PYTHON" benchmarks/compiled_speed.py --device cuda --dtype bf16 --gpt-model GPT-B --tokens 256 \
        --batch-sizes 1 8 --repeats 2 --samplers mcsjd lantern --out "$OUT/compiled_gptb" ${COMPILED_ARGS:-}
}

# the text-to-image parity tests (CPU tests: on a GPU machine they check its torch and transformers), and of
# test_speculative_sampler.py only its tests of a t2i model
T2I_TESTS=(tests/models/test_llamagen_t2i.py tests/models/test_janus.py tests/models/test_text_encoder.py
    tests/models/test_conditioning.py tests/samplers/test_sampler_janus.py tests/pipelines/test_load.py
    tests/models/test_emu3.py tests/samplers/test_sampler_emu3.py tests/models/test_lumina.py
    tests/samplers/test_sampler_lumina.py tests/models/test_anole.py tests/models/test_mllm.py
    tests/samplers/test_sampler_layout.py tests/models/test_mllm_sizes.py
    tests/samplers/speculative/test_speculative_sampler.py)

step_t2i_tests() {
    local workers=()
    if [ "$T2I_TEST_WORKERS" != 0 ] && "$PYTHON" -c 'import xdist' 2>/dev/null; then
        workers=(-n "$T2I_TEST_WORKERS")
    fi
    run 240 "$PYTHON" -m pytest -m "gpu or not gpu" -k "not test_speculative_sampler or t2i or caption" \
        -p no:cacheprovider -q -rfEs --durations=10 "${workers[@]}" "${T2I_TESTS[@]}"
}

step_t2i_speed() {
    # shellcheck disable=SC2086
    run 330 "$PYTHON" benchmarks/t2i_speed.py --device cuda --dtype bf16 --batch-sizes 1 8 --repeats 1 \
        --models llamagen-t2i janus-pro-1b --out "$OUT" ${T2I_SPEED_ARGS:-}
}

step_t2i_mllm() {
    local rows=${T2I_MLLM_ROWS-6}
    # shellcheck disable=SC2086
    run 360 "$PYTHON" benchmarks/t2i_speed.py --device cuda --dtype bf16 --batch-sizes 1 4 --repeats 1 \
        --models emu3-gen lumina-mgpt-7b ${rows:+--rows "$rows"} --out "$OUT/t2i_mllm" ${T2I_SPEED_ARGS:-}
}

step_tree() {
    # shellcheck disable=SC2086
    run 540 "$PYTHON" benchmarks/tree_speed.py --device cuda --dtype bf16 --batch-sizes 1 8 \
        --models shapes-c2i llamagen-t2i --out "$OUT/tree_speed" ${TREE_SPEED_ARGS:-}
}

ALL=(env tests kernels speculative ar)
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=("${ALL[@]}")
for STEP in "${STEPS[@]}"; do
    case "$STEP" in
        env | tests | kernels | speculative | ar | extra | compiled | t2i_speed | t2i_mllm | t2i_tests | tree) ;;
        *)
            echo "unknown step '$STEP'; steps: ${ALL[*]} extra compiled t2i_speed t2i_mllm t2i_tests tree" >&2
            exit 99
            ;;
    esac
done
echo "vgen GPU check: steps ${STEPS[*]}; logs in $OUT; budget ${BUDGET_S}s; $(date)" | tee -a "$SUMMARY"
for STEP in "${STEPS[@]}"; do
    "step_$STEP"
done
echo "=== summary ($SECONDS s in all; $FAILED step command(s) did not pass)"
cat "$SUMMARY"
exit "$FAILED"
