"""Build AdaptiveLoad's two compiled modules.

- ``adaptiveload._C``: the torch ops (``TORCH_LIBRARY(adaptiveload, ...)``). CPU
  kernels always; CUDA kernels when torch is a CUDA build and a CUDA toolkit is
  found (``CUDA_HOME``), whether or not this machine has a GPU.
- ``adaptiveload._sampler``: the pybind11 binding of the pure C++ sampler core.
  It does not link torch.

Build isolation must be off (``pip install --no-build-isolation .``): ``_C`` has to
be compiled against the very torch it will be imported with, and an isolated
build would download a second, possibly different, torch of several GB.

Knobs (standard torch ones, nothing of our own): ``TORCH_CUDA_ARCH_LIST``
(default below), ``MAX_JOBS`` (parallel compile jobs, read by ninja through
torch.utils.cpp_extension), ``CUDA_HOME``.
"""

import glob
import os

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))

def _with_cuda() -> bool:
    # Note: never ask whether a GPU is present; build machines often have none.
    import torch

    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _rel(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def _ops_extension():
    sources = _rel("csrc/ops/*.cpp") + _rel("csrc/ops/cpu/*.cpp") + _rel("csrc/ops/autograd/*.cpp")
    cxx_flags = ["-O3", "-std=c++17"]
    if _with_cuda():
        # A100 (8.0) and H100/H200 (9.0) machine code, plus PTX for newer GPUs.
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
        return cpp_extension.CUDAExtension(
            "adaptiveload._C",
            sources + _rel("csrc/ops/cuda/*.cu"),
            extra_compile_args={
                "cxx": cxx_flags + ["-DADAPTIVELOAD_WITH_CUDA"],
                "nvcc": ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo",
                         "-DADAPTIVELOAD_WITH_CUDA"],
            },
        )
    return cpp_extension.CppExtension(
        "adaptiveload._C", sources, extra_compile_args={"cxx": cxx_flags}
    )


def _sampler_extension():
    return Pybind11Extension(
        "adaptiveload._sampler",
        _rel("csrc/sampler/*.cpp") + _rel("csrc/bindings/*.cpp"),
        include_dirs=[os.path.join(ROOT, "csrc")],
        cxx_std=17,
        extra_compile_args=["-O3"],
    )


setup(
    ext_modules=[_ops_extension(), _sampler_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
