#!/usr/bin/env bash
# The GPU lab in one command (lldmon_lab/gpu_lab.py): on a machine with only Python, PyTorch and
# transformers, install the carried wheels offline, train a ~150M-parameter policy with GRPO and the
# hooks (LLDS off and auto) against lldmon on SQLite, time the hooks at realistic sizes, and write the
# exported runs, the lab summary and the overhead table to --out. examples/README.md says how to run it
# on the device machine and bring the results back.
#   bash scripts/gpu-lab.sh --out "$OUT"                 # the device machine (wheels in .gpu-lab-wheels)
#   bash scripts/gpu-lab.sh --size tiny --out /tmp/lab   # the same on a CPU in a minute or two
# Environment: PYTHON (default python3), GPU_LAB_WHEELS (default .gpu-lab-wheels; installed when the
# folder exists, empty to skip).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
wheels=${GPU_LAB_WHEELS-$root/.gpu-lab-wheels}
args=()
if [ -n "$wheels" ] && [ -d "$wheels" ]; then
    args+=(--wheels "$wheels")
fi
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$python" -m lldmon_lab.gpu_lab ${args[@]+"${args[@]}"} "$@"
