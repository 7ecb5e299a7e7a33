#!/usr/bin/env bash
# Download the GPU lab's wheels (scripts/gpu-lab-requirements.txt) for the device machine (linux x86_64,
# CPython 3.11 unless GPU_LAB_PYTHON_VERSION says otherwise) from the package index pip is configured
# with, re-compress the large ones with LZMA, and check that they fit the device's carry budget together
# with the working tree (prints the sizes; exit 1 if over). Wheels already in DIR are kept; files of no
# listed package are removed. Usage: scripts/gpu-lab-wheels.sh DIR
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:?usage: scripts/gpu-lab-wheels.sh DIR (e.g. .gpu-lab-wheels, ignored by git)}
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
pyver=${GPU_LAB_PYTHON_VERSION:-3.11}
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

mkdir -p "$dir"
missing=$(mktemp)
trap 'rm -f "$missing"' EXIT
"$python" -m lldmon_lab.gpu_wheels missing "$dir" >"$missing"
if [ -s "$missing" ]; then
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --implementation cp --python-version "$pyver" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
        --platform manylinux2010_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
        -r "$missing" -d "$dir"
fi
"$python" -m lldmon_lab.gpu_wheels check "$dir" --repack --prune
