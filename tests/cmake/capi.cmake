# The C API (include/estream/estream.h, libestream.so) from a program compiled as C, not C++:
# load, tokens, batches, embeddings, candidates, statistics, every error path, two threads on one
# model, on the tiny shared OLMoE model.
if(ESTREAM_BUILD_TESTS)
  add_executable(capi_test ${CMAKE_SOURCE_DIR}/tests/capi_test.c)
  set_target_properties(capi_test PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
  target_compile_options(capi_test PRIVATE -pedantic -Werror=implicit-function-declaration)
  target_link_libraries(capi_test PRIVATE estream_shared Threads::Threads m)
  add_test(NAME capi_test COMMAND capi_test ${ESTREAM_SHARED_DIR}/testdata/models)
  set_tests_properties(capi_test PROPERTIES LABELS "capi;model;sanitize" TIMEOUT 120)
  add_dependencies(estream_tests_sanitize capi_test)
endif()
# The budgeted load (a budget that `estream prefill` runs with loads through the C API too): the
# tiny OLMoE model packed by the CLI first (a fixture), then capi_test MODELS_DIR PACKED_MODEL.
# Not labelled sanitize: the sanitizer build does not build the CLI (so no dependency on it).
if(ESTREAM_BUILD_TESTS AND TARGET estream)
  set(_capi_packed ${CMAKE_CURRENT_BINARY_DIR}/capi_olmoe-tiny.packed.gguf)
  add_test(NAME capi_budget_pack
    COMMAND $<TARGET_FILE:estream> pack -q ${ESTREAM_SHARED_DIR}/testdata/models/olmoe-tiny-f32.gguf -o ${_capi_packed})
  set_tests_properties(capi_budget_pack PROPERTIES FIXTURES_SETUP capi_packed LABELS "capi;model" TIMEOUT 60)
  add_test(NAME capi_budget_test COMMAND capi_test ${ESTREAM_SHARED_DIR}/testdata/models ${_capi_packed})
  set_tests_properties(capi_budget_test PROPERTIES FIXTURES_REQUIRED capi_packed LABELS "capi;model" TIMEOUT 120)
endif()
