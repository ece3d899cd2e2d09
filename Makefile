# The few targets a person needs. `make test` is what CI runs (.ci/run).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# Parallel compile jobs (MAX_JOBS for the extensions, -j for the C++ tests): all cores.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: install develop demo test test-fast test-oldest-torch test-newest-torch test-cpp test-python lint format \
	gpu-check bench-sampler clean

install:  ## build and install against the torch already installed (the tested one if none)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -r requirements/torch.txt
	$(PIP) install -r requirements/build.txt
	MAX_JOBS=$(JOBS) $(PIP) install --no-build-isolation .

develop:  ## build the extensions in place under python/ for work on the code
	MAX_JOBS=$(JOBS) $(PYTHON) setup.py build_ext --inplace

demo: install  ## the main job on built-in demo data
	adaptiveload plan --demo

test-cpp:  ## GoogleTest suite of the C++ sampler core
	cmake -S . -B build/cmake -DCMAKE_BUILD_TYPE=Release
	cmake --build build/cmake -j $(JOBS)
	ctest --test-dir build/cmake --output-on-failure

test-python:  ## pytest against the installed package
	$(PYTHON) -m pytest tests/python --durations=20

test-fast:  ## day-to-day lane: the Python tests that start no other process and are not slow
	$(PYTHON) -m pytest tests/python -m "not distributed and not slow" -q --durations=20

test-oldest-torch:  ## fast tests against the oldest supported torch: fresh venv, CPU ops only
	PYTHON=$(PYTHON) bash scripts/test_torch_lane.sh oldest

test-newest-torch:  ## ops tests and plan --demo against the newest torch: fresh venv, CPU ops
	PYTHON=$(PYTHON) bash scripts/test_torch_lane.sh newest

test:  ## whole suite against the pinned torch, then the lanes of the oldest and newest torch
	$(PIP) install -r requirements/torch.txt -r requirements/test.txt
# DiffSynth-Studio's Wan model (tests/python/test_diffsynth.py) without its declared
# dependencies, which it does not need for that: about 350 MB and 55 s on a fresh machine.
	$(PIP) install --no-deps -r requirements/diffsynth.txt
	MAX_JOBS=$(JOBS) $(PIP) install --no-build-isolation .
	$(MAKE) test-cpp
	$(MAKE) test-python
	$(MAKE) test-oldest-torch
	$(MAKE) test-newest-torch

lint:
	ruff check python tests benchmarks examples
	ruff format --check python tests benchmarks examples
	clang-format --dry-run -Werror $$(git ls-files 'csrc/*.cpp' 'csrc/*.h' 'csrc/*.cu' 'csrc/*.cuh' 'tests/cpp/*.cpp')

format:
	ruff format python tests benchmarks examples
	clang-format -i $$(git ls-files 'csrc/*.cpp' 'csrc/*.h' 'csrc/*.cu' 'csrc/*.cuh' 'tests/cpp/*.cpp')

gpu-check:  ## on a CUDA machine: build, GPU tests, benchmarks, short table
	bash scripts/gpu_check.sh

bench-sampler:
	$(PYTHON) benchmarks/bench_sampler.py

clean:
	rm -rf build dist python/*.egg-info python/adaptiveload/*.so
