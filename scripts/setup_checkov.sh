#!/usr/bin/env bash
# Install the checkov policy scanner into its own virtual environment
# (tests/cluster/test_chart_scan.py scans the rendered chart with it).
#
# Why a separate venv: checkov 3.3.30 pins packaging 23.2, networkx 2.6 and boto3/botocore 1.35,
# which would downgrade what torch, moto and the rest of EnvACE's stack are tested with
# (`pip install --dry-run checkov` in .venv shows the downgrades). The test only runs its CLI.
#
# Usage: bash scripts/setup_checkov.sh            (venv in .cache/checkov-venv, git-ignored)
#        CHECKOV_VENV=/some/dir PYTHON=python3.11 bash scripts/setup_checkov.sh
#        (the test then needs ENVACE_CHECKOV=/some/dir/bin/checkov)
# Idempotent: a stamp file naming the version skips a finished venv. ~290 MB, about 90 s on the
# CI machines.
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/pyinstall.sh
VENV="${CHECKOV_VENV:-.cache/checkov-venv}"
CHECKOV_VERSION="${CHECKOV_VERSION:-3.3.30}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.stamp-checkov-$CHECKOV_VERSION"

if [[ -f "$STAMP" && -x "$VENV/bin/checkov" ]]; then
  echo "checkov $CHECKOV_VERSION already set up in $VENV"
  exit 0
fi

# pip warns once per package about this machine's local index folders; keep the log readable.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

"$PYTHON" -m venv "$VENV"
quiet pyinstall "$VENV" "checkov==$CHECKOV_VERSION"
# Offline and without the vendor's API (BC_SKIP_MAPPING): the way the test runs it.
BC_SKIP_MAPPING=TRUE "$VENV/bin/checkov" --version
touch "$STAMP"
