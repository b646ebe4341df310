# Locates LibTorch inside the PyPI `torch` wheel and defines the imported target Keel::torch.
#
# Why not find_package(Torch): the wheel's TorchConfig adds the system CUDA toolkit's cudart
# and nvrtc to every link line next to the wheel's own CUDA libraries, i.e. a second CUDA
# runtime. Keel reaches CUDA only through LibTorch, so it links the wheel's libraries alone.
#
# Inputs:  KEEL_TORCH_ROOT (the torch package folder; found with python3 when unset),
#          KEEL_WITH_CUDA = AUTO | ON | OFF.
# Outputs: Keel::torch, KEEL_TORCH_VERSION, KEEL_TORCH_CUDA (ON when CUDA code is compiled).
if(TARGET Keel::torch)
  return()
endif()

if(NOT KEEL_TORCH_ROOT)
  find_program(KEEL_PYTHON NAMES python3 python)
  execute_process(
    COMMAND "${KEEL_PYTHON}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _keel_torch_root OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _keel_torch_rc ERROR_QUIET)
  if(NOT _keel_torch_rc EQUAL 0 OR NOT _keel_torch_root)
    message(FATAL_ERROR "Keel: '${KEEL_PYTHON}' cannot import torch. Run tools/bootstrap, or pass "
                        "-DKEEL_TORCH_ROOT=<site-packages>/torch.")
  endif()
  set(KEEL_TORCH_ROOT "${_keel_torch_root}" CACHE PATH "The torch package folder (holds include/ and lib/)")
endif()

set(_keel_version_h "${KEEL_TORCH_ROOT}/include/torch/headeronly/version.h")
if(NOT EXISTS "${_keel_version_h}" OR NOT EXISTS "${KEEL_TORCH_ROOT}/lib/libtorch.so")
  message(FATAL_ERROR "Keel: ${KEEL_TORCH_ROOT} is not a LibTorch with headers (no ${_keel_version_h})")
endif()
file(READ "${_keel_version_h}" _keel_version_text)
string(REGEX MATCH "TORCH_VERSION_MAJOR ([0-9]+)" _m "${_keel_version_text}")
set(_major "${CMAKE_MATCH_1}")
string(REGEX MATCH "TORCH_VERSION_MINOR ([0-9]+)" _m "${_keel_version_text}")
set(_minor "${CMAKE_MATCH_1}")
string(REGEX MATCH "TORCH_VERSION_PATCH ([0-9]+)" _m "${_keel_version_text}")
set(KEEL_TORCH_VERSION "${_major}.${_minor}.${CMAKE_MATCH_1}")

# CUDA: compiled whenever this LibTorch has it (AUTO), headers from the wheel's CUDA packages
# or a toolkit; nothing from the toolkit is linked.
if(NOT DEFINED KEEL_WITH_CUDA OR KEEL_WITH_CUDA STREQUAL "")  # "OFF" is a value, not unset
  set(KEEL_WITH_CUDA AUTO)
endif()
set(KEEL_TORCH_CUDA OFF)
get_filename_component(_keel_site "${KEEL_TORCH_ROOT}" DIRECTORY)
file(GLOB _keel_nvidia_libs LIST_DIRECTORIES true "${_keel_site}/nvidia/*/lib")
file(GLOB _keel_nvidia_includes LIST_DIRECTORIES true "${_keel_site}/nvidia/cu*/include")
if(NOT KEEL_WITH_CUDA STREQUAL "OFF" AND EXISTS "${KEEL_TORCH_ROOT}/lib/libtorch_cuda.so")
  find_path(KEEL_CUDA_INCLUDE_DIR cuda_runtime_api.h
            HINTS ${_keel_nvidia_includes} ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
            PATH_SUFFIXES include NO_DEFAULT_PATH)
  if(KEEL_CUDA_INCLUDE_DIR)
    set(KEEL_TORCH_CUDA ON)
  endif()
  # NCCL's header, for c10d's ProcessGroupNCCL (the library itself comes with libtorch_cuda).
  find_path(KEEL_NCCL_INCLUDE_DIR nccl.h HINTS "${_keel_site}/nvidia/nccl/include" ENV CUDA_HOME
            PATH_SUFFIXES include NO_DEFAULT_PATH)
endif()
if(KEEL_WITH_CUDA STREQUAL "ON" AND NOT KEEL_TORCH_CUDA)
  message(FATAL_ERROR "Keel: KEEL_WITH_CUDA=ON, but ${KEEL_TORCH_ROOT} has no libtorch_cuda.so or no CUDA "
                      "headers (cuda_runtime_api.h) were found")
endif()

add_library(Keel::torch INTERFACE IMPORTED GLOBAL)
set_target_properties(Keel::torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${KEEL_TORCH_ROOT}/include;${KEEL_TORCH_ROOT}/include/torch/csrc/api/include"
  INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1")
# libstdc++ first: LibTorch 2.11's libtorch.so exports a copy of std::filesystem (remove_all,
# status, ...) that crashes when called from Keel; the first library needed that defines a
# symbol is the one every caller gets, so libstdc++ must come before LibTorch.
set(_keel_torch_libs "-Wl,--push-state,--no-as-needed" "-lstdc++" "-Wl,--pop-state"
                     "${KEEL_TORCH_ROOT}/lib/libtorch.so" "${KEEL_TORCH_ROOT}/lib/libtorch_cpu.so"
                     "${KEEL_TORCH_ROOT}/lib/libc10.so")
set(_keel_link_options "LINKER:-rpath,${KEEL_TORCH_ROOT}/lib")
foreach(_dir IN LISTS _keel_nvidia_libs)
  # Lets the linker resolve libtorch_cuda's own CUDA dependencies from the wheel.
  list(APPEND _keel_link_options "LINKER:-rpath-link,${_dir}")
endforeach()
if(KEEL_TORCH_CUDA)
  set_property(TARGET Keel::torch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${KEEL_CUDA_INCLUDE_DIR}")
  set_property(TARGET Keel::torch APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS "KEEL_WITH_CUDA=1")
  # --no-as-needed: libtorch_cuda registers the CUDA backend from its static initialisers.
  list(APPEND _keel_torch_libs "-Wl,--no-as-needed" "${KEEL_TORCH_ROOT}/lib/libtorch_cuda.so"
       "${KEEL_TORCH_ROOT}/lib/libc10_cuda.so" "-Wl,--as-needed")
  # LibTorch's inline CUDA helpers (streams, events, graphs) call the CUDA runtime directly:
  # link the very libcudart libtorch_cuda loads (the wheel's), never a toolkit's second one.
  file(GLOB _keel_wheel_cudart "${_keel_site}/nvidia/*/lib/libcudart.so*")
  if(_keel_wheel_cudart)
    list(GET _keel_wheel_cudart 0 _keel_wheel_cudart)
    list(APPEND _keel_torch_libs "${_keel_wheel_cudart}")
  endif()
endif()
set_target_properties(Keel::torch PROPERTIES
  INTERFACE_LINK_LIBRARIES "${_keel_torch_libs}"
  INTERFACE_LINK_OPTIONS "${_keel_link_options}")
message(STATUS "Keel: LibTorch ${KEEL_TORCH_VERSION} at ${KEEL_TORCH_ROOT} (CUDA code: ${KEEL_TORCH_CUDA})")
