# Optional NVIDIA libraries beyond the CUDA toolkit, each exposed as a target:
#   baracuda_cutlass         CUTLASS/CuTe headers (PyPI nvidia-cutlass, installed by scripts/setup.sh)
#   baracuda_cudnn           cuDNN 9 (the toolkit's, or -DCUDNN_ROOT=<dir with include/ and lib/>)
#   baracuda_cudnn_frontend  cuDNN frontend headers (PyPI nvidia-cudnn-frontend) + cuDNN
# A family that uses one checks BARACUDA_HAVE_<X> and registers its kernels only when present.
set(BARACUDA_CUTLASS_INCLUDE "${PROJECT_SOURCE_DIR}/third_party/cutlass/cutlass_library/source/include"
    CACHE PATH "CUTLASS include directory")
set(BARACUDA_HAVE_CUTLASS OFF)
if(BARACUDA_WITH_CUDA AND EXISTS "${BARACUDA_CUTLASS_INCLUDE}/cutlass/cutlass.h")
  add_library(baracuda_cutlass INTERFACE)
  target_include_directories(baracuda_cutlass SYSTEM INTERFACE "${BARACUDA_CUTLASS_INCLUDE}")
  set(BARACUDA_HAVE_CUTLASS ON)
endif()

# OFF: build without cuDNN even where it is installed (the selection rules' fallbacks for a
# machine without it are tested so).
option(BARACUDA_WITH_CUDNN "Use cuDNN (and its frontend) where found" ON)
set(BARACUDA_HAVE_CUDNN OFF)
set(BARACUDA_HAVE_CUDNN_FRONTEND OFF)
if(BARACUDA_WITH_CUDA AND BARACUDA_WITH_CUDNN)
  # A changed CUDNN_ROOT must find again: the cached paths would keep the old library.
  if(NOT "${CUDNN_ROOT}" STREQUAL "${_BARACUDA_CUDNN_ROOT_FOUND}")
    unset(CUDNN_INCLUDE_DIR CACHE)
    unset(CUDNN_LIBRARY CACHE)
    set(_BARACUDA_CUDNN_ROOT_FOUND "${CUDNN_ROOT}" CACHE INTERNAL "")
  endif()
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
  # Wheels ship only the versioned name.
  find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${CUDNN_ROOT}/lib ${CUDNN_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    add_library(baracuda_cudnn INTERFACE)
    target_include_directories(baracuda_cudnn SYSTEM INTERFACE "${CUDNN_INCLUDE_DIR}")
    target_link_libraries(baracuda_cudnn INTERFACE "${CUDNN_LIBRARY}")
    set(BARACUDA_HAVE_CUDNN ON)
    set(_fe "${PROJECT_SOURCE_DIR}/third_party/cudnn_frontend/include")
    if(EXISTS "${_fe}/cudnn_frontend.h")
      add_library(baracuda_cudnn_frontend INTERFACE)
      target_include_directories(baracuda_cudnn_frontend SYSTEM INTERFACE "${_fe}")
      # The frontend compiles some engines at run time through NVRTC.
      target_link_libraries(baracuda_cudnn_frontend INTERFACE baracuda_cudnn CUDA::nvrtc)
      set(BARACUDA_HAVE_CUDNN_FRONTEND ON)
    endif()
  endif()
endif()
message(STATUS "baracuda: CUDA=${BARACUDA_WITH_CUDA} CUTLASS=${BARACUDA_HAVE_CUTLASS} cuDNN=${BARACUDA_HAVE_CUDNN} cuDNN frontend=${BARACUDA_HAVE_CUDNN_FRONTEND}")
