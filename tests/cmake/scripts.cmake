# The Python scripts under scripts/ that drive the estream binary, run on the tiny shared model
# (their real comparisons need other engines' builds and full-size models: docs/PERFORMANCE.md).
# speed_vs_llamacpp.py against a stand-in llama-bench (tests/scripts/fake_llama_bench.py): the
# holds and their order, the samples it keeps, the ratios, its JSON and its error line
# (tests/scripts/speed_vs_llamacpp_test.py).
if(ESTREAM_BUILD_TESTS)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    add_test(NAME speed_vs_llamacpp_script
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/scripts/speed_vs_llamacpp_test.py $<TARGET_FILE:estream>
              ${ESTREAM_SHARED_DIR}/testdata/models/olmoe-tiny-f32.gguf
              ${ESTREAM_SHARED_DIR}/testdata/models/olmoe-tiny.tokens.txt)
    set_tests_properties(speed_vs_llamacpp_script PROPERTIES LABELS "scripts" TIMEOUT 120)
  endif()
endif()
