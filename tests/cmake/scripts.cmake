# The Python scripts under scripts/ that drive the estream binary, run on the tiny shared model
# (their real comparisons need other engines' builds and full-size models: docs/PERFORMANCE.md).
# speed_vs_llamacpp.py against a stand-in llama-bench (tests/scripts/fake_llama_bench.py): the
# holds, the estream sweep it parses and the JSON it prints.
if(ESTREAM_BUILD_TESTS)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    add_test(NAME speed_vs_llamacpp_script
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/scripts/speed_vs_llamacpp.py
              --llama-bench ${CMAKE_SOURCE_DIR}/tests/scripts/fake_llama_bench.py --llama-args "-fa 1"
              --estream $<TARGET_FILE:estream> -m ${ESTREAM_SHARED_DIR}/testdata/models/olmoe-tiny-f32.gguf
              --tokens ${ESTREAM_SHARED_DIR}/testdata/models/olmoe-tiny.tokens.txt -p 12 -t 1 --holds 2 --reps 2 --json)
    set_tests_properties(speed_vs_llamacpp_script PROPERTIES LABELS "scripts" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "\"ratio_pooled\": [0-9.]+")
  endif()
endif()
