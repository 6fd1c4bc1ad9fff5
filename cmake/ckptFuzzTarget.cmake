# ckpt_add_fuzzer(NAME SOURCES .. LIBS .. [INCLUDES ..]): with -DCKPT_FUZZ=ON,
# the libFuzzer target ckpt_fuzz_<name> for a parser of untrusted input
# outside format/ (interop/, interop/hdf5/, tools/reshard/), built like the
# targets of fuzz/: its sources compiled with coverage and ASan+UBSan that
# do not recover, linked with the instrumented codec (ckpt_format_fuzz of
# fuzz/), written to ${CMAKE_BINARY_DIR}/fuzz, where scripts/fuzz-smoke
# runs it. The parser's sources are listed in SOURCES (so that they are
# instrumented too) rather than linked from their library; INCLUDES are
# the include directories they need besides fuzz/ and libckpt/include.
function(ckpt_add_fuzzer name)
  if(NOT CKPT_FUZZ)
    return()
  endif()
  cmake_parse_arguments(F "" "" "SOURCES;LIBS;INCLUDES" ${ARGN})
  add_executable(ckpt_fuzz_${name} ${F_SOURCES})
  target_include_directories(ckpt_fuzz_${name} PRIVATE
    ${F_INCLUDES} ${CMAKE_SOURCE_DIR}/fuzz ${CMAKE_SOURCE_DIR}/libckpt/include)
  target_link_libraries(ckpt_fuzz_${name} PRIVATE ckpt_format_fuzz ${F_LIBS})
  target_compile_options(ckpt_fuzz_${name} PRIVATE
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
  target_link_options(ckpt_fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  set_target_properties(ckpt_fuzz_${name} PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
endfunction()
