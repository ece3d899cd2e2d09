"""Build AdaptiveLoad's two compiled modules against the torch already installed.

- ``adaptiveload._C``: the torch ops (``TORCH_LIBRARY(adaptiveload, ...)``). CPU
  kernels always; CUDA kernels when torch is a CUDA build and a CUDA toolkit is
  found (``CUDA_HOME``), whether or not this machine has a GPU.
- ``adaptiveload._sampler``: the pybind11 binding of the pure C++ sampler core.
  It does not link torch.

Build isolation must be off (``pip install --no-build-isolation .``): ``_C`` has to
be compiled against the very torch it will be imported with. torch is therefore
not a build requirement in pyproject.toml: an isolated build finds none and says so,
instead of downloading a second torch of several GB that may differ from yours.

Build-time environment variables (torch's own convention for extensions):

- ``ADAPTIVELOAD_CUDA``: unset or ``auto`` builds the CUDA kernels when torch has
  CUDA and nvcc is found; ``0`` builds the CPU ops only (no CUDA toolkit needed);
  ``1`` requires the CUDA kernels and fails if they cannot be built.
- ``TORCH_CUDA_ARCH_LIST``: GPU architectures. Unset: those of the GPUs that
  ``nvidia-smi`` reports on this machine, else ``8.0;9.0+PTX``.
- ``MAX_JOBS``: parallel compile jobs (default: this machine's cores).
- ``CUDA_HOME``: the CUDA toolkit to use.

See docs/install.md.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
# Oldest torch the ops build and pass the tests with (keep in step with pyproject.toml,
# requirements/torch-oldest.txt and docs/install.md).
MIN_TORCH = (2, 6)
# Newest torch the ops were built and tested against (the registry's newest when it was set).
# A newer one builds with a note: pyproject.toml has no upper bound, so that pip never swaps
# the installed torch. (torch 2.13 moved C++ autograd nodes to c10::intrusive_ptr: nodes.h
# takes either.)
NEWEST_TESTED = (2, 15)
DEFAULT_ARCHS = "8.0;9.0+PTX"  # A100, H100/H200, and PTX for newer GPUs


def _fail(message: str):
    sys.exit("\nadaptiveload build error: " + message.strip() + "\n")


def _note(message: str):
    print("adaptiveload build: " + message, file=sys.stderr)


def _import_build_deps():
    try:
        import torch
    except ImportError:
        _fail(
            f"""
no torch is importable by this build ({sys.executable}).
AdaptiveLoad compiles its ops against the torch of the environment it installs into.
- If torch is installed there, this is an isolated build (a plain `pip install .`), which
  cannot see it: build with `pip install --no-build-isolation .`
- Otherwise install torch first ({MIN_TORCH[0]}.{MIN_TORCH[1]} to {NEWEST_TESTED[0]}.{NEWEST_TESTED[1]}; the pinned one:
  `pip install -r requirements/torch.txt`), then `pip install --no-build-isolation .`"""
        )
    try:
        import pybind11  # noqa: F401
    except ImportError:
        _fail("pybind11 is missing: `pip install -r requirements/build.txt`, then build again.")
    version = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
    if version < MIN_TORCH:
        _fail(
            f"torch {torch.__version__} is installed; AdaptiveLoad needs torch >= "
            f"{MIN_TORCH[0]}.{MIN_TORCH[1]}. Upgrade it (`pip install -r requirements/torch.txt` "
            "installs the tested version), then build again."
        )
    if version > NEWEST_TESTED:
        _note(
            f"torch {torch.__version__} is newer than the newest tested "
            f"({NEWEST_TESTED[0]}.{NEWEST_TESTED[1]}); building against it anyway"
        )
    return torch


def _nvcc_version(cuda_home: str) -> str | None:
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out.stdout)
    return match.group(1) if match else None


def _with_cuda(torch, cpp_extension) -> bool:
    """Whether to build the CUDA kernels; fails with what to do where they cannot be built
    against this torch. Never asks torch about GPUs: that would initialize CUDA, and build
    machines often have none."""
    switch = os.environ.get("ADAPTIVELOAD_CUDA", "auto").strip().lower()
    if switch not in ("auto", "0", "1", ""):
        _fail(f"ADAPTIVELOAD_CUDA={switch!r}: use 0 (CPU ops only), 1 (require CUDA) or auto.")
    if switch == "0":
        _note("ADAPTIVELOAD_CUDA=0: building the CPU ops only.")
        return False
    cuda_home = cpp_extension.CUDA_HOME
    torch_cuda = torch.version.cuda
    reason = None
    if torch_cuda is None:
        reason = f"torch {torch.__version__} has no CUDA"
    elif cuda_home is None:
        reason = "no CUDA toolkit (nvcc) found: set CUDA_HOME or put nvcc on PATH"
    if reason is not None:
        if switch == "1":
            _fail(f"ADAPTIVELOAD_CUDA=1 but the CUDA kernels cannot be built: {reason}.")
        _note(f"{reason}; building the CPU ops only.")
        return False
    nvcc = _nvcc_version(cuda_home)
    if nvcc is None:
        _fail(f"cannot run {os.path.join(cuda_home, 'bin', 'nvcc')} --version (CUDA_HOME).")
    if nvcc.split(".")[0] != torch_cuda.split(".")[0]:
        _fail(
            f"""
torch {torch.__version__} is built for CUDA {torch_cuda}, but the CUDA toolkit found
({cuda_home}) is CUDA {nvcc}; CUDA extensions must be compiled with the CUDA major
version torch was built with. Either:
  - install a CUDA {torch_cuda.split(".")[0]}.x toolkit and point CUDA_HOME at it
    (CUDA_HOME=/usr/local/cuda-{torch_cuda} pip install --no-build-isolation .), or
  - build without the CUDA kernels (CPU ops and the sampler only):
    ADAPTIVELOAD_CUDA=0 pip install --no-build-isolation ."""
        )
    return True


def _gpu_archs() -> str | None:
    """Compute capabilities of this machine's GPUs, from nvidia-smi (not torch, which would
    initialize CUDA), as a TORCH_CUDA_ARCH_LIST; None where there is no GPU or no answer."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    caps = {line.strip() for line in out.splitlines() if re.fullmatch(r"\d+\.\d+", line.strip())}
    if not caps:
        return None
    return ";".join(sorted(caps, key=lambda c: tuple(int(p) for p in c.split("."))))


def _set_arch_list():
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        _note(f"CUDA kernels for TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}.")
        return
    archs = _gpu_archs()
    if archs is None:
        archs = DEFAULT_ARCHS
        where = "no GPU found by nvidia-smi: the default list"
    else:
        where = "the GPUs of this machine"
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    _note(f"CUDA kernels for {archs} ({where}; set TORCH_CUDA_ARCH_LIST to choose).")


def _rel(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def _ops_extension(torch, cpp_extension):
    sources = _rel("csrc/ops/*.cpp") + _rel("csrc/ops/cpu/*.cpp") + _rel("csrc/ops/autograd/*.cpp")
    # No -std flag: torch.utils.cpp_extension adds the standard its headers need (C++17, or
    # C++20 for newer torch, whose headers refuse C++17).
    cxx_flags = ["-O3"]
    if _with_cuda(torch, cpp_extension):
        _set_arch_list()
        nvcc_flags = ["-O3", "--use_fast_math", "-lineinfo"]
        return cpp_extension.CUDAExtension(
            "adaptiveload._C",
            sources + _rel("csrc/ops/cuda/*.cu"),
            extra_compile_args={
                "cxx": cxx_flags + ["-DADAPTIVELOAD_WITH_CUDA"],
                "nvcc": nvcc_flags + ["-DADAPTIVELOAD_WITH_CUDA"],
            },
        )
    return cpp_extension.CppExtension(
        "adaptiveload._C", sources, extra_compile_args={"cxx": cxx_flags}
    )


def _sampler_extension():
    from pybind11.setup_helpers import Pybind11Extension

    return Pybind11Extension(
        "adaptiveload._sampler",
        _rel("csrc/sampler/*.cpp") + _rel("csrc/bindings/*.cpp"),
        include_dirs=[os.path.join(ROOT, "csrc")],
        cxx_std=17,
        extra_compile_args=["-O3"],
    )


def main():
    from setuptools import setup

    torch = _import_build_deps()
    from torch.utils import cpp_extension

    # ninja's parallelism, read by torch.utils.cpp_extension.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("MAX_JOBS", str(cores or 1))
    _note(f"torch {torch.__version__}, MAX_JOBS={os.environ['MAX_JOBS']}.")
    setup(
        ext_modules=[_ops_extension(torch, cpp_extension), _sampler_extension()],
        cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    )


main()
