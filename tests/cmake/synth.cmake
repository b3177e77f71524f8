# estream synth (presets, BPE builder, generator) and estream inspect. The synth sources are
# compiled into the tests directly so that they do not depend on the rest of estream_model.
set(ESTREAM_SYNTH_SOURCES
  ${CMAKE_SOURCE_DIR}/src/model/synth.cc
  ${CMAKE_SOURCE_DIR}/src/model/presets.cc
  ${CMAKE_SOURCE_DIR}/src/model/bpe_builder.cc)
estream_add_test(synth_test SOURCES ${CMAKE_SOURCE_DIR}/tests/synth_test.cc ${ESTREAM_SYNTH_SOURCES}
  LIBS estream_gguf estream_quant estream_base OpenMP::OpenMP_CXX LABELS synth)

# The summary of `estream inspect` (gguf/summary.h) on synthetic and shared files; the CLI as users
# run it (estream synth / inspect bad input), through the built binary.
estream_add_test(inspect_test SOURCES ${CMAKE_SOURCE_DIR}/tests/inspect_test.cc ${ESTREAM_SYNTH_SOURCES}
  LIBS estream_gguf estream_quant estream_base nlohmann_json::nlohmann_json OpenMP::OpenMP_CXX LABELS synth)
if(TARGET inspect_test)
  add_dependencies(inspect_test estream)
  target_compile_definitions(inspect_test PRIVATE ESTREAM_CLI="$<TARGET_FILE:estream>")
endif()
