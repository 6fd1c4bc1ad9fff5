# Finds NCCL (nccl.h and libnccl) under the CUDA Toolkit first, then in the
# default paths (Debian's libnccl-dev), and defines the imported target
# NCCL::nccl. Used by gpu/nccl/CMakeLists.txt when building ckpt and by
# ckptConfig.cmake when a consumer loads ckpt::ckpt_nccl, so both find the
# same way. REQUIRES: find_package(CUDAToolkit) ran first. Sets
# CKPT_NCCL_FOUND.
if(TARGET NCCL::nccl)
  set(CKPT_NCCL_FOUND TRUE)
else()
  find_path(CKPT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(CKPT_NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
          ${CUDAToolkit_TARGET_DIR}
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
