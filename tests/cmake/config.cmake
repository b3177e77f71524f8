# Configurator core (owner: config): max-plus evaluator, profile metadata, selection.
estream_add_test(config_maxplus_test SOURCES ${CMAKE_SOURCE_DIR}/tests/config_maxplus_test.cc
  LIBS estream_config LABELS config sanitize)
estream_add_test(config_profile_test SOURCES ${CMAKE_SOURCE_DIR}/tests/config_profile_test.cc
  LIBS estream_config estream_gguf LABELS config sanitize)
estream_add_test(config_select_test SOURCES ${CMAKE_SOURCE_DIR}/tests/config_select_test.cc
  LIBS estream_config LABELS config sanitize)
