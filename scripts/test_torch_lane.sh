#!/usr/bin/env bash
# A torch lane of `make test`: in a fresh virtual environment, install one end of the supported
# torch range (requirements/torch-LANE.txt) and the test packages, build the CPU ops and the
# sampler against that torch (ADAPTIVELOAD_CUDA=0, from a copy of the sources so that the other
# lanes' build/ is left alone), check the install kept that torch, and run the lane's tests:
#
#   oldest  the fast tests (no other process, not slow)
#   newest  the ops' tests (forward, backward, schemas, properties) and `adaptiveload plan
#           --demo`: what changes with torch's C++ API (the sampler core does not use torch)
#
# Tests that need something this torch lacks skip with the reason. Fails when a step fails.
#
#   bash scripts/test_torch_lane.sh oldest|newest     (PYTHON picks the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
lane=${1:?usage: test_torch_lane.sh oldest|newest}
case $lane in oldest | newest) ;; *) echo "unknown lane: $lane" >&2; exit 2 ;; esac
PYTHON=${PYTHON:-python3}
dir=build/$lane-torch
start=$SECONDS
step() { echo "$lane-torch lane: $1 (+$((SECONDS - start)) s)"; }

rm -rf "$dir"
mkdir -p "$dir/src"
step "fresh virtual environment in $dir/venv"
"$PYTHON" -m venv "$dir/venv"
py="$dir/venv/bin/python"

step "torch and the test packages"
# --no-compile: no bytecode for the thousands of files of a throwaway torch (CPU time).
"$py" -m pip install -q --no-compile -r "requirements/torch-$lane.txt" -r requirements/test.txt
want=$(sed -n 's/^torch==//p' "requirements/torch-$lane.txt")

step "CPU-only build against torch $want"
cp -r setup.py pyproject.toml README.md LICENSE csrc python "$dir/src/"
find "$dir/src/python" \( -name '*.so' -o -name '*.egg-info' -o -name __pycache__ \) -prune \
  -exec rm -rf {} +
ADAPTIVELOAD_CUDA=0 "$py" -m pip install -q --no-build-isolation "$dir/src"
# The install must have kept the lane's torch (pyproject's torch>=2.6 allows any).
"$py" -c "import sys, torch; v = torch.__version__.split('+')[0]; \
sys.exit(0 if v == '$want' else f'$lane-torch lane: torch {v} installed, expected $want')"

if [ "$lane" = oldest ]; then
  step "fast tests"
  "$py" -m pytest tests/python -m "not distributed and not slow" -q --durations=10
else
  step "the ops' tests"
  "$py" -m pytest tests/python/test_ops.py tests/python/test_ops_schemas.py \
    tests/python/test_ops_tables.py tests/python/test_ops_properties.py -q
  step "plan --demo"
  (cd "$dir" && "$(pwd)/venv/bin/adaptiveload" plan --demo --figure none | tail -3)
fi
step "done"
