# `estream serve` (issue 20). server_scheduler_test and server_http_test use a fake engine (no
# OpenMP), so they also run under ThreadSanitizer (label tsan) and ASan+UBSan (sanitize);
# server_engine_test runs the real engine on the tiny shared model behind a real HTTP client
# (results equal the library's; concurrent == sequential; a bounded load test), and `estream serve`'s
# flag checks in a child process (ServeCli.*: needs the estream binary, so not in the sanitizer builds).
estream_add_test(server_scheduler_test SOURCES ${CMAKE_SOURCE_DIR}/tests/server_scheduler_test.cc
  LIBS estream_server LABELS server tsan sanitize)
estream_add_test(server_http_test SOURCES ${CMAKE_SOURCE_DIR}/tests/server_http_test.cc
  LIBS estream_server LABELS server tsan sanitize)
if(TARGET server_http_test)
  target_include_directories(server_http_test PRIVATE ${CMAKE_SOURCE_DIR})
endif()
estream_add_test(server_engine_test SOURCES ${CMAKE_SOURCE_DIR}/tests/server_engine_test.cc
  LIBS estream_server estream_gguf LABELS server load)
if(TARGET server_engine_test)
  target_include_directories(server_engine_test PRIVATE ${CMAKE_SOURCE_DIR})
  add_dependencies(server_engine_test estream)  # ServeCli.* runs the CLI
endif()
# The official OpenAI Node client (npm `openai`, installed by scripts/setup.sh into tests/node)
# against the `estream serve` binary, then SIGTERM -> exit 0. Skipped where node is missing.
if(ESTREAM_BUILD_TESTS)
  add_test(NAME server_openai_node_test
    COMMAND ${CMAKE_SOURCE_DIR}/tests/server_openai_node_test.sh $<TARGET_FILE:estream>
            ${ESTREAM_SHARED_DIR}/testdata/models/olmoe-tiny-f32.gguf ${CMAKE_SOURCE_DIR})
  set_tests_properties(server_openai_node_test PROPERTIES LABELS "server" SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
