#!/usr/bin/env bash
# The oldest-torch lane of `make test`: in a fresh virtual environment, install the oldest
# supported torch (requirements/torch-oldest.txt) and the test packages, build the CPU ops and
# the sampler against that torch (ADAPTIVELOAD_CUDA=0, from a copy of the sources so that the
# other lane's build/ is left alone), and run the fast tests (no other process, not slow).
# Tests that need something this torch lacks skip with the reason. Fails when a step fails.
#
#   bash scripts/test_oldest_torch.sh        (PYTHON picks the interpreter, default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
dir=build/oldest-torch
start=$SECONDS
step() { echo "oldest-torch lane: $1 (+$((SECONDS - start)) s)"; }

rm -rf "$dir"
mkdir -p "$dir/src"
step "fresh virtual environment in $dir/venv"
"$PYTHON" -m venv "$dir/venv"
py="$dir/venv/bin/python"

step "torch and the test packages"
# --no-compile: no bytecode for the thousands of files of a throwaway torch (CPU time).
"$py" -m pip install -q --no-compile -r requirements/torch-oldest.txt -r requirements/test.txt
want=$(sed -n 's/^torch==//p' requirements/torch-oldest.txt)

step "CPU-only build against torch $want"
cp -r setup.py pyproject.toml README.md LICENSE csrc python "$dir/src/"
find "$dir/src/python" \( -name '*.so' -o -name '*.egg-info' -o -name __pycache__ \) -prune \
  -exec rm -rf {} +
ADAPTIVELOAD_CUDA=0 "$py" -m pip install -q --no-build-isolation "$dir/src"
# The install must have kept the oldest torch (pyproject's torch>=2.6 allows it).
"$py" -c "import sys, torch; v = torch.__version__.split('+')[0]; \
sys.exit(0 if v == '$want' else f'oldest-torch lane: torch {v} installed, expected $want')"

step "fast tests"
"$py" -m pytest tests/python -m "not distributed and not slow" -q --durations=10
step "done"
