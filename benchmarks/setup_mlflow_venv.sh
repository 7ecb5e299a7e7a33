#!/usr/bin/env bash
# Create .venv-bench (the MLflow tracking server for the ingest comparison) next to the project's .venv.
# Usage: bash benchmarks/setup_mlflow_venv.sh [VENV_DIR]   (default: <repo>/.venv-bench)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/.venv-bench}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q -r "$root/benchmarks/requirements-mlflow.txt"
"$venv/bin/mlflow" --version
