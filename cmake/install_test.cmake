# The install test (ctest label `install`), run with cmake -P:
#   1. cmake --install CKPT_BUILD_DIR --prefix CKPT_WORK_DIR/prefix
#   2. checks the installed tree: libraries, package files, tools, and that
#      every "ckpt/..." include of an installed header is
#      installed too; each optional component installed (ckpt_mpi, ckpt_gpu,
#      ckpt_nccl) is found by find_package(ckpt COMPONENTS ...);
#   3. configures examples/trainer against the prefix (find_package(ckpt)),
#      builds it with Ninja -j2 and runs it.
# Inputs (-D): CKPT_SOURCE_DIR, CKPT_BUILD_DIR, CKPT_WORK_DIR,
# CKPT_CXX_COMPILER, CKPT_SANITIZE (the build's sanitizers, '' for none:
# the installed static libraries then need the same flags).
cmake_minimum_required(VERSION 3.20)

foreach(var CKPT_SOURCE_DIR CKPT_BUILD_DIR CKPT_WORK_DIR CKPT_CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix ${CKPT_WORK_DIR}/prefix)
set(build ${CKPT_WORK_DIR}/trainer-build)
file(REMOVE_RECURSE ${CKPT_WORK_DIR})
file(MAKE_DIRECTORY ${CKPT_WORK_DIR})

function(run step)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${rc}):\n${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

# 1. Install.
run("install" ${CMAKE_COMMAND} --install ${CKPT_BUILD_DIR} --prefix ${prefix})

# 2. The installed tree.
foreach(pattern lib*/libckpt.a lib*/libckpt_format.a lib*/cmake/ckpt/ckptConfig.cmake
        lib*/cmake/ckpt/ckptConfigVersion.cmake lib*/cmake/ckpt/ckptTargets.cmake
        include/ckpt/writer.h include/ckpt/reader.h include/ckpt/version.h
        include/ckpt/format/geometry.h bin/ckpt-synth)
  file(GLOB_RECURSE found RELATIVE ${prefix} ${prefix}/${pattern})
  if(NOT found)
    file(GLOB_RECURSE all RELATIVE ${prefix} ${prefix}/*)
    string(REPLACE ";" "\n" all "${all}")
    message(FATAL_ERROR "not installed: ${pattern}\nInstalled:\n${all}")
  endif()
endforeach()
file(GLOB_RECURSE headers ${prefix}/include/ckpt/*.h)
foreach(h ${headers})
  file(STRINGS ${h} includes REGEX "^#include \"ckpt/")
  foreach(line ${includes})
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" inc "${line}")
    if(NOT EXISTS ${prefix}/include/${inc})
      message(FATAL_ERROR "${h} includes \"${inc}\", which is not installed")
    endif()
  endforeach()
endforeach()

# 2b. Each optional component that was installed (ckpt::ckpt_mpi,
# ckpt::ckpt_gpu, ckpt::ckpt_nccl) loads through
# find_package(ckpt COMPONENTS ...) in a project of its own: configured only.
set(components "")
foreach(c Mpi:ckpt_mpi Gpu:ckpt_gpu Nccl:ckpt_nccl)
  string(REPLACE ":" ";" pair ${c})
  list(GET pair 0 file)
  list(GET pair 1 target)
  file(GLOB_RECURSE exported ${prefix}/lib*/cmake/ckpt/ckpt${file}Targets.cmake)
  if(exported)
    list(APPEND components ${target})
  endif()
endforeach()
foreach(c ${components})
  set(dir ${CKPT_WORK_DIR}/component-${c})
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${dir}/CMakeLists.txt "cmake_minimum_required(VERSION 3.20)
project(ckpt_component LANGUAGES C CXX)
find_package(ckpt 0.1 REQUIRED COMPONENTS ${c})
if(NOT TARGET ckpt::${c})
  message(FATAL_ERROR \"find_package(ckpt COMPONENTS ${c}) defined no ckpt::${c}\")
endif()
")
  run("find_package(ckpt COMPONENTS ${c})" ${CMAKE_COMMAND} -S ${dir} -B ${dir}/build
    -G Ninja -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CKPT_CXX_COMPILER}
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
endforeach()
message(STATUS "optional components found through find_package: ${components}")

# 3. Build and run the example against the prefix only.
set(flags "")
if(CKPT_SANITIZE)
  set(flags -DCMAKE_CXX_FLAGS=-fsanitize=${CKPT_SANITIZE}
            -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${CKPT_SANITIZE})
endif()
run("configure examples/trainer" ${CMAKE_COMMAND}
  -S ${CKPT_SOURCE_DIR}/examples/trainer -B ${build} -G Ninja
  -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CKPT_CXX_COMPILER}
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON ${flags})
run("build examples/trainer" ${CMAKE_COMMAND} --build ${build} -j2)
run("run the trainer" ${build}/trainer ${CKPT_WORK_DIR}/run)
message(STATUS "trainer output:\n${last_output}")
if(NOT last_output MATCHES "resumed from .*/step-00000200 at step 200: every value matches")
  message(FATAL_ERROR "unexpected trainer output:\n${last_output}")
endif()
file(REMOVE_RECURSE ${CKPT_WORK_DIR})
