# Finds NCCL (nccl.h and libnccl) under the CUDA Toolkit first, then in the
# Python environment's `nvidia.nccl` package (PyPI's nvidia-nccl-cu13, which
# requirements.txt pins and CUDA builds of torch depend on: include/ and
# lib/libnccl.so.2), then in the default paths (libnccl-dev), and defines
# the imported target
# NCCL::nccl. Used by gpu/nccl/CMakeLists.txt when building ckpt and by
# ckptConfig.cmake when a consumer loads ckpt::ckpt_nccl, so both find the
# same way (the installed config adds CKPT_NCCL_HINTS: the directories
# where ckpt's build found it). REQUIRES: find_package(CUDAToolkit) ran
# first. Sets CKPT_NCCL_FOUND.
if(TARGET NCCL::nccl)
  set(CKPT_NCCL_FOUND TRUE)
else()
  set(_ckpt_nccl_py_dir "")
  set(_ckpt_nccl_python ${Python3_EXECUTABLE})
  if(NOT _ckpt_nccl_python)
    find_program(_ckpt_nccl_python NAMES python3)
  endif()
  if(_ckpt_nccl_python)
    execute_process(COMMAND ${_ckpt_nccl_python} -c
      "import nvidia.nccl as n; print(list(n.__path__)[0])"
      OUTPUT_VARIABLE _ckpt_nccl_py_dir OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET RESULT_VARIABLE _ckpt_nccl_rc)
    if(NOT _ckpt_nccl_rc EQUAL 0)
      set(_ckpt_nccl_py_dir "")
    endif()
  endif()
  find_path(CKPT_NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_ckpt_nccl_py_dir}/include ${CKPT_NCCL_HINTS})
  # The wheel has only the versioned libnccl.so.2.
  find_library(CKPT_NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
          ${CUDAToolkit_TARGET_DIR} ${_ckpt_nccl_py_dir} ${CKPT_NCCL_HINTS}
    PATH_SUFFIXES lib lib64)
  if(CKPT_NCCL_INCLUDE_DIR AND CKPT_NCCL_LIBRARY)
    # GLOBAL: ckpt::ckpt_nccl is linked from other directories.
    add_library(NCCL::nccl UNKNOWN IMPORTED GLOBAL)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION ${CKPT_NCCL_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${CKPT_NCCL_INCLUDE_DIR})
    set(CKPT_NCCL_FOUND TRUE)
  else()
    set(CKPT_NCCL_FOUND FALSE)
  endif()
endif()
