# Helpers that give every gpufleet target the same include root, warnings and naming:
# gpufleet_cc_library -> static library gpufleet_<name>, alias gpufleet::<name>.

# Aggregates with default member values are initialised partially on purpose.
set(GPUFLEET_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wno-missing-field-initializers)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  list(APPEND GPUFLEET_WARNINGS -Wthread-safety)
endif()
# A unity build (-DCMAKE_UNITY_BUILD=ON, what scripts/build configures) compiles each target's
# .cc files a batch at a time, included by one generated file: names in their anonymous namespaces
# must differ within a target. GCC then takes the included .cc files for headers and warns of a
# class (a pimpl's Impl) holding a type of the anonymous namespace, which is sound in a .cc file;
# the build without unity keeps that warning for the real headers.
if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  list(APPEND GPUFLEET_WARNINGS -Wno-subobject-linkage)
endif()
if(GPUFLEET_WERROR)
  list(APPEND GPUFLEET_WARNINGS -Werror)
endif()

# Test code compiles at -O1 (it follows the build type's -O2 on the command line, so it wins):
# it is half of the build's compile time and -O1 compiles it about 40 % faster, while the
# libraries under test, the gpufleet binary and the benchmarks keep the build type's flags.
set(GPUFLEET_TEST_COMPILE_OPTIONS ${GPUFLEET_WARNINGS})
if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo|MinSizeRel)$")
  list(APPEND GPUFLEET_TEST_COMPILE_OPTIONS -O1)
endif()

function(gpufleet_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "HDRS;SRCS;DEPS" ${ARGN})
  add_library(gpufleet_${ARG_NAME} STATIC ${ARG_SRCS} ${ARG_HDRS})
  add_library(gpufleet::${ARG_NAME} ALIAS gpufleet_${ARG_NAME})
  target_include_directories(gpufleet_${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(gpufleet_${ARG_NAME} PRIVATE ${GPUFLEET_WARNINGS})
  target_link_libraries(gpufleet_${ARG_NAME} PUBLIC ${ARG_DEPS})
endfunction()

# One test binary per module; every GoogleTest case becomes a CTest test carrying LABELS. FILTER
# (a gtest filter such as "-Slow*") limits which cases are discovered under those labels.
function(gpufleet_cc_test)
  cmake_parse_arguments(ARG "" "NAME;FILTER" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT GPUFLEET_BUILD_TESTS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_compile_options(${ARG_NAME} PRIVATE ${GPUFLEET_TEST_COMPILE_OPTIONS})
  target_compile_definitions(${ARG_NAME} PRIVATE
    GPUFLEET_TEST_DATA_DIR="${GPUFLEET_DATA_DIR}")
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  if(ARG_FILTER)
    gtest_discover_tests(${ARG_NAME} TEST_FILTER "${ARG_FILTER}"
      PROPERTIES LABELS "${ARG_LABELS}" DISCOVERY_TIMEOUT 60)
  else()
    gtest_discover_tests(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" DISCOVERY_TIMEOUT 60)
  endif()
endfunction()

# Benchmarks build with the tests and run as a smoke test (label bench) with a tiny min time.
function(gpufleet_cc_benchmark)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  if(NOT GPUFLEET_BUILD_BENCHMARKS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_compile_options(${ARG_NAME} PRIVATE ${GPUFLEET_WARNINGS})
  target_compile_definitions(${ARG_NAME} PRIVATE
    GPUFLEET_TEST_DATA_DIR="${GPUFLEET_DATA_DIR}")
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} benchmark::benchmark)
  if(GPUFLEET_BUILD_TESTS)
    add_test(NAME ${ARG_NAME}_smoke
      COMMAND ${ARG_NAME} --benchmark_min_time=0.001 --benchmark_repetitions=1)
    set_tests_properties(${ARG_NAME}_smoke PROPERTIES LABELS bench)
  endif()
endfunction()

# A libFuzzer target (clang only; not a test: scripts/fuzz builds and runs it). SRCS are compiled
# in with the fuzzer's coverage instrumentation and ASan/UBSan, each file alone (no unity batch);
# DEPS are linked as they are, uninstrumented.
function(gpufleet_fuzzer)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  set_target_properties(${ARG_NAME} PROPERTIES UNITY_BUILD OFF)
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${ARG_NAME} PRIVATE ${GPUFLEET_WARNINGS}
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(${ARG_NAME} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
endfunction()

# Embeds FILES ("name=path;...") in the binary: at build time cmake/EmbedFiles.cmake writes OUTPUT,
# a source defining NAMESPACE::EmbeddedFiles() as HEADER declares it; add OUTPUT to a target's SRCS.
function(gpufleet_embed_files)
  cmake_parse_arguments(ARG "" "OUTPUT;HEADER;NAMESPACE;COMMENT" "FILES" ${ARGN})
  set(deps "")
  foreach(entry IN LISTS ARG_FILES)
    string(REGEX REPLACE "^[^=]*=" "" file "${entry}")
    list(APPEND deps "${file}")
  endforeach()
  add_custom_command(
    OUTPUT ${ARG_OUTPUT}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${ARG_OUTPUT} -DHEADER=${ARG_HEADER}
            -DNAMESPACE=${ARG_NAMESPACE} "-DFILES=${ARG_FILES}"
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedFiles.cmake
    DEPENDS ${deps} ${PROJECT_SOURCE_DIR}/cmake/EmbedFiles.cmake
    COMMENT "${ARG_COMMENT}"
    VERBATIM)
endfunction()
