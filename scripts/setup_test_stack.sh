#!/usr/bin/env bash
# Set up the real components the test suite starts, each in its own venv, side by side:
# BFCL's checkers and executable worlds, vLLM's CPU build, checkov, the MLflow tracking server
# (and helm into .tools/). The installs are independent, so they run at once; one after the
# other they took most of CI's install time (docs/benchmarks.md, "make test back inside CI's 30
# minutes").
#
# Usage: PYTHON=python3.11 bash scripts/setup_test_stack.sh [COMMAND...]
# A COMMAND (the Makefile passes .venv's `pip install -e ".[test,...]"`) runs beside them as one
# more job, "project".
# Each job's output goes to its own log (in $ENVACE_SETUP_LOGS, default .cache/setup-logs); a
# failed job's log is printed whole and the script fails naming it, after the others finish (no
# half-written venv is left stamped: each setup script writes its stamp last). Every script is
# idempotent, so a rerun only redoes what failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="${ENVACE_SETUP_LOGS:-$ROOT/.cache/setup-logs}"
mkdir -p "$LOGS"

# ENVACE_SETUP_JOBS picks some of them (e.g. "setup_vllm_cpu setup_mlflow_server"; empty: none).
read -r -a JOBS <<<"${ENVACE_SETUP_JOBS-install_tools setup_bfcl setup_vllm_cpu setup_checkov setup_mlflow_server}"
for job in "${JOBS[@]}"; do
    [[ -f "$ROOT/scripts/$job.sh" ]] || { echo "setup_test_stack.sh: no scripts/$job.sh (ENVACE_SETUP_JOBS)" >&2; exit 2; }
done
declare -A PIDS=()
START=$SECONDS
launch() {  # launch NAME COMMAND...: run COMMAND in the background, its output in NAME's log
    local job=$1
    shift
    ( start=$SECONDS
      "$@"
      echo "[$job] done in $((SECONDS - start)) s" ) >"$LOGS/$job.log" 2>&1 &
    PIDS[$job]=$!
}
for job in "${JOBS[@]}"; do
    launch "$job" bash "$ROOT/scripts/$job.sh"
done
if (($#)); then
    JOBS+=(project)
    launch project "$@"
fi

failed=()
for job in "${JOBS[@]}"; do
    if wait "${PIDS[$job]}"; then
        tail -n 1 "$LOGS/$job.log"
    else
        failed+=("$job")
        echo "[$job] FAILED; its log ($LOGS/$job.log):" >&2
        sed 's/^/    /' "$LOGS/$job.log" >&2
    fi
done
echo "test stack set up side by side in $((SECONDS - START)) s"
if ((${#failed[@]})); then
    echo "setup_test_stack.sh: ${failed[*]} failed (logs above). Fix the cause and rerun" \
        "'make test': finished venvs are kept and skipped." >&2
    exit 1
fi
