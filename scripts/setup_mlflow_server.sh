#!/usr/bin/env bash
# Build the isolated MLflow tracking-server virtual environment used by the tracking tests
# (tests/train/test_tracking_mlflow.py starts `mlflow server` from it on 127.0.0.1).
#
# Why a separate venv: the full `mlflow` package (the server: SQLAlchemy, alembic, Flask, pandas,
# scikit-learn, ...) would downgrade pyarrow in EnvACE's venv (26.0.1 -> 25.0.1, 2026-12), so it
# lives here; EnvACE itself only needs the client, mlflow-skinny (the `tracking` extra), which
# changes no installed version. Result: ~850 MB (pyarrow, scipy, pandas, scikit-learn come with the
# server), about 3 minutes on the CI machines. Idempotent: a stamp file skips a finished venv.
#
# Usage: bash scripts/setup_mlflow_server.sh            (venv in .cache/mlflow-venv)
#        MLFLOW_VENV=/some/dir PYTHON=python3.11 bash scripts/setup_mlflow_server.sh
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/pyinstall.sh
VENV="${MLFLOW_VENV:-.cache/mlflow-venv}"
# 3.17.2: mlflow 3.18.0 pins mlflow-tracing==3.18.0, which the package index lacks (2026-12).
MLFLOW_VERSION="${MLFLOW_VERSION:-3.17.2}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.stamp-mlflow-auth-$MLFLOW_VERSION"

if [[ -f "$STAMP" ]]; then
  echo "mlflow $MLFLOW_VERSION already set up in $VENV"
  exit 0
fi

"$PYTHON" -m venv "$VENV"
# [auth]: the basic-auth server app (`mlflow server --app-name basic-auth`), so tests check that
# credentials reach the server from the environment.
pyinstall "$VENV" "mlflow[auth]==$MLFLOW_VERSION"
# The server's entry point and its basic-auth app must load.
"$VENV/bin/mlflow" --version
"$VENV/bin/python" -c "import flask_wtf"
touch "$STAMP"
