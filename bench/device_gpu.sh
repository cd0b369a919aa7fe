#!/usr/bin/env bash
# One call on a lent GPU machine (see docs/benchmarks.md, "GPU"): install the wheels carried in
# .whl/ (DeepSpeed and what it and the task loader need; the machine has no network), check the
# imports, then run `bench/gpu.py --mode gpu`. Everything lands in $OUT: the JSON (rewritten after
# every case, so a killed run keeps what finished), the log and the card's nvidia-smi line.
#   wheels (here):  see docs/benchmarks.md
#   run (device):   bash bench/device_gpu.sh      with .whl carried
set -u
out=${OUT:-/tmp/bench-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 3; }
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch-ext
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$out/nvidia-smi.csv"
python3 -c "import deepspeed, jsonschema, torch, transformers, envace.run as r; \
print('imports ok: deepspeed', deepspeed.__version__, 'torch', torch.__version__, \
'transformers', transformers.__version__)" || exit 4
set -o pipefail
timeout "${BENCH_TIMEOUT_S:-420}" python3 bench/gpu.py --mode gpu --no-vllm ${BENCH_ARGS:-} \
    --out "$out/bench-gpu.json" 2>&1 | tee "$out/bench-gpu.log"
rc=$?
# BENCH_CHECKPOINT=1: also split one RL checkpoint of the 0.6B shape into its parts (~1 min)
if [ "${BENCH_CHECKPOINT:-0}" = 1 ]; then
    timeout 240 python3 bench/checkpoint.py --shape qwen3-0.6b --device cuda \
        --out "$out/bench-checkpoint.json" 2>&1 | tee "$out/bench-checkpoint.log"
fi
exit $rc
