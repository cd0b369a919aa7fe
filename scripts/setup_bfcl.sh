#!/usr/bin/env bash
# Build the isolated bfcl-eval virtual environment used by `envace evaluate --benchmark bfcl:...`.
#
# Why a separate venv: bfcl-eval pins numpy==1.26.4 and pulls every vendor SDK (openai, anthropic,
# cohere, mistralai, google-genai, qwen-agent, boto3, ...), which must not meet EnvACE's stack; and
# it executes calls with eval() on module globals, so EnvACE only ever runs it in a subprocess
# (envace/evaluate/bfcl/worker.py).
#
# What is installed: bfcl-eval itself without dependencies, then its declared dependencies MINUS
# sentence-transformers and faiss-cpu (only the memory_vector category imports them, and they
# would pull torch + a CUDA build: gigabytes), PLUS soundfile (qwen-agent 0.0.34 imports it without
# declaring it, so a plain `pip install bfcl-eval` cannot import bfcl's checkers at all).
# Result: ~560 MB, about 50 s on the CI machines. Idempotent: a stamp file skips a finished venv.
#
# Usage: bash scripts/setup_bfcl.sh            (venv in .cache/bfcl-venv)
#        BFCL_VENV=/some/dir PYTHON=python3.11 bash scripts/setup_bfcl.sh
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/pyinstall.sh
VENV="${BFCL_VENV:-.cache/bfcl-venv}"
BFCL_VERSION="${BFCL_VERSION:-2026.3.23}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.stamp-bfcl-eval-$BFCL_VERSION"

if [[ -f "$STAMP" ]]; then
  echo "bfcl-eval $BFCL_VERSION already set up in $VENV"
  exit 0
fi

"$PYTHON" -m venv "$VENV"
pyinstall "$VENV" --no-deps "bfcl-eval==$BFCL_VERSION"
"$VENV/bin/python" - > "$VENV/bfcl-requirements.txt" <<'EOF'
import re
from importlib.metadata import requires

left_out = {"sentence-transformers", "faiss-cpu"}
for req in requires("bfcl-eval") or []:
    if "extra ==" in req:
        continue
    name = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")
    if name not in left_out:
        print(req)
print("soundfile")
EOF
# pip warns that bfcl-eval's two left-out requirements are missing: expected, see above.
LOG="$VENV/pip-install.log"
if ! pyinstall "$VENV" -r "$VENV/bfcl-requirements.txt" > "$LOG" 2>&1; then
  cat "$LOG" >&2
  exit 1
fi
grep -v -e "requires faiss-cpu" -e "requires sentence-transformers" \
  -e "dependency resolver does not currently" -e "is ignored" "$LOG" || true

# The checkers and executable classes the adapter uses must import.
ROOT="$(mktemp -d)"
trap 'rm -rf "$ROOT"' EXIT
BFCL_PROJECT_ROOT="$ROOT" "$VENV/bin/python" -c "
import importlib.metadata
import bfcl_eval.eval_checker.ast_eval.ast_checker
import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker
import bfcl_eval.utils
print('bfcl-eval', importlib.metadata.version('bfcl-eval'), 'ready')
"
touch "$STAMP"
