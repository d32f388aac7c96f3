# Runs `${GPUFLEET} ${ARGS} --json FILE` twice, with 1 and 2 threads, and fails unless the two
# JSON files are byte-identical.
foreach(threads 1 2)
  execute_process(COMMAND ${GPUFLEET} ${ARGS} --threads ${threads} --json ${OUT}_${threads}.json
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run with ${threads} thread(s) failed: ${rc}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT}_1.json ${OUT}_2.json
                RESULT_VARIABLE differ)
if(differ)
  message(FATAL_ERROR "${OUT}_1.json and ${OUT}_2.json differ")
endif()
