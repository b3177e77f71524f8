# estream synth (presets, BPE builder, generator) and estream inspect. The synth sources are
# compiled into the tests directly so that they do not depend on the rest of estream_model.
set(ESTREAM_SYNTH_SOURCES
  ${CMAKE_SOURCE_DIR}/src/model/synth.cc
  ${CMAKE_SOURCE_DIR}/src/model/presets.cc
  ${CMAKE_SOURCE_DIR}/src/model/bpe_builder.cc)
estream_add_test(synth_test SOURCES ${CMAKE_SOURCE_DIR}/tests/synth_test.cc ${ESTREAM_SYNTH_SOURCES}
  LIBS estream_gguf estream_quant estream_base OpenMP::OpenMP_CXX LABELS synth)
