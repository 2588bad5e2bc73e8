# Finds LibTorch the way users get it: from a PyTorch 2.x installation's Python.
#
# VARUNA_PYTHON is a python whose `import torch` is the PyTorch to build against. Default: the
# environment of scripts/python_env.sh when it is made (what install_deps.sh, CI and the demo
# use: torch 2.11 from PyPI), else python3 on PATH. From it:
# - CMAKE_PREFIX_PATH gains torch.utils.cmake_prefix_path, so find_package(Torch) finds the
#   wheel's LibTorch (a CMAKE_PREFIX_PATH or Torch_DIR given by hand wins: it is searched first);
# - a CUDA LibTorch needs a CUDA toolkit at configure time (its Caffe2Config enables CUDA and
#   runs nvcc). When NVIDIA's PyPI toolkit sits beside torch (site-packages/nvidia/cu13 with
#   bin/nvcc, from scripts/python-requirements.txt), it is used unless one was named
#   (CUDA_TOOLKIT_ROOT_DIR or CMAKE_CUDA_COMPILER); otherwise FindCUDA looks where it always
#   does (/usr/local/cuda, PATH), as on a GPU machine with its own toolkit.
# Sets VARUNA_PYTHON for the tests, which run their Python with it, and records it as
# VARUNA_PYTHON_RESOLVED in the cache. Only a Python named by the user is cached: the default is
# looked up again at every configure, so a change of pins (a new environment) is followed.
set(VARUNA_PYTHON "$ENV{VARUNA_PYTHON}" CACHE FILEPATH
    "Python whose torch is built against (default: scripts/python_env.sh's, else python3)")
if(NOT VARUNA_PYTHON)
  execute_process(COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/scripts/python_env.sh" --path
                  OUTPUT_VARIABLE varuna_env_python OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE varuna_env_rc ERROR_QUIET)
  if(varuna_env_rc EQUAL 0 AND EXISTS "${varuna_env_python}")
    set(VARUNA_PYTHON "${varuna_env_python}")
  else()
    find_program(varuna_path_python3 python3)
    if(varuna_path_python3)
      set(VARUNA_PYTHON "${varuna_path_python3}")
    endif()
  endif()
endif()
set(VARUNA_PYTHON_RESOLVED "${VARUNA_PYTHON}" CACHE INTERNAL "the Python the build and tests use")

execute_process(
  COMMAND "${VARUNA_PYTHON}" -c
          "import os, torch; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(os.path.dirname(os.path.dirname(torch.__file__)))"
  OUTPUT_VARIABLE varuna_torch_info OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE varuna_torch_rc ERROR_VARIABLE varuna_torch_err)
if(NOT varuna_torch_rc EQUAL 0)
  if(NOT Torch_DIR AND NOT CMAKE_PREFIX_PATH)
    message(FATAL_ERROR
      "varuna: '${VARUNA_PYTHON}' cannot import torch, and no LibTorch was named. Run "
      "scripts/install_deps.sh (it makes the project's Python environment with torch 2.11), or "
      "pass -DVARUNA_PYTHON=/path/to/python with PyTorch 2.x installed, or "
      "-DCMAKE_PREFIX_PATH=<LibTorch> (docs/operations.md \"Install\").\n${varuna_torch_err}")
  endif()
  message(STATUS "varuna: ${VARUNA_PYTHON} has no torch; using CMAKE_PREFIX_PATH / Torch_DIR")
else()
  string(REPLACE "\n" ";" varuna_torch_info "${varuna_torch_info}")
  list(GET varuna_torch_info 0 varuna_torch_prefix)
  list(GET varuna_torch_info 1 varuna_torch_python_version)
  list(GET varuna_torch_info 2 varuna_site_packages)
  list(APPEND CMAKE_PREFIX_PATH "${varuna_torch_prefix}")
  message(STATUS "varuna: PyTorch ${varuna_torch_python_version} from ${VARUNA_PYTHON}")
  set(varuna_cu "${varuna_site_packages}/nvidia/cu13")
  if(EXISTS "${varuna_cu}/bin/nvcc" AND NOT CUDA_TOOLKIT_ROOT_DIR AND NOT CMAKE_CUDA_COMPILER
     AND NOT DEFINED ENV{CUDA_HOME} AND NOT DEFINED ENV{CUDACXX})
    if(NOT EXISTS "${varuna_cu}/lib64" OR NOT EXISTS "${varuna_cu}/lib/libcudart.so")
      message(FATAL_ERROR
        "varuna: the CUDA toolkit from PyPI in ${varuna_cu} lacks lib64/ and the unversioned "
        "libraries nvcc and FindCUDA look for; scripts/python_env.sh links them (run it)")
    endif()
    set(CUDA_TOOLKIT_ROOT_DIR "${varuna_cu}" CACHE PATH "CUDA toolkit (PyPI's, beside torch)")
    set(CUDAToolkit_ROOT "${varuna_cu}" CACHE PATH "CUDA toolkit (PyPI's, beside torch)")
    set(CMAKE_CUDA_COMPILER "${varuna_cu}/bin/nvcc" CACHE FILEPATH "nvcc (PyPI's, beside torch)")
  endif()
endif()
# The project compiles no CUDA kernels of its own; naming one architecture keeps LibTorch's
# CMake from guessing on a machine without a GPU (its "common architectures" list).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for LibTorch's CMake")
endif()
# Architectures come from TORCH_CUDA_ARCH_LIST alone (LibTorch's CMake warns about, and ignores,
# CMAKE_CUDA_ARCHITECTURES).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
endif()
