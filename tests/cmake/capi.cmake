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
