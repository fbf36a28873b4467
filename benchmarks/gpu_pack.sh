# Sourced by the one-call GPU scripts.
#
# pack RESULT OUT WORK writes the folder RESULT as one tar (kept in WORK), split into 15 MiB parts
# OUT/result.tar.part-NN with its sha256 in OUT/result.tar.sha256, replacing any earlier parts; a device returns at
# most 8 files of at most 16 MiB each, and `cat result.tar.part-* | tar -x` unpacks it.
pack() {
    rm -f "$2"/result.tar.part-*
    tar -C "$1" -cf "$3/result.tar" .
    sha256sum "$3/result.tar" | cut -d' ' -f1 >"$2/result.tar.sha256"
    split -b 15M -d "$3/result.tar" "$2/result.tar.part-"
}

# train_until END_AT MAX_STEPS RUN COMMAND... runs a `vgen train` COMMAND (given without --steps, --max-minutes and
# --override-config) that trains in the folder RUN so that it ends annealed at END_AT (seconds since the epoch)
# whatever the device's speed: PROBE_S (45) seconds of training under a schedule of MAX_STEPS steps, logged every
# PROBE_LOG_EVERY (5) steps so that even a slow device times a few windows, then a resume with the schedule laid
# over the steps the measured speed reaches by END_AT (at most MAX_STEPS), cut at END_AT.
train_until() {
    local end_at=$1 max_steps=$2 run=$3
    shift 3
    "$@" --steps "$max_steps" --log-every "${PROBE_LOG_EVERY:-5}" \
        --max-minutes "$(awk "BEGIN { print ${PROBE_S:-45} / 60 }")"
    local left=$((end_at - $(date +%s) - ${RESTART_S:-15})) done_steps steps
    read -r done_steps steps < <(python3 -c "import json, sys
from vgen.training.trainer import STATE, latest_checkpoint, steps_reachable
run, left, cap = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
print(json.loads((latest_checkpoint(run) / STATE).read_text())['step'], steps_reachable(run, left, cap))" \
        "$run" "$left" "$max_steps")
    if [ "$steps" -le "$done_steps" ] || [ "$left" -le 0 ]; then
        echo "train_until: the probe ended at step $done_steps; no time or steps left for more"
        return
    fi
    echo "train_until: step $done_steps after the probe; the schedule laid over $steps steps to end in ${left}s"
    "$@" --steps "$steps" --override-config --max-minutes "$(awk "BEGIN { print ($left + 10) / 60 }")"
}

# use_carried_wheels installs the wheels in WHEELS (.whl), if any, into WHEEL_SITE (/tmp/vgen-site) ahead of the
# machine's own packages: a device image can lack a dependency (the H200's has no diffusers, which the KL tokenizer
# needs), and with no package index there the wheels travel with the call (`carry`).
use_carried_wheels() {
    local dir=${WHEELS:-.whl} site=${WHEEL_SITE:-/tmp/vgen-site}
    compgen -G "$dir/*.whl" >/dev/null || return 0
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
}
