# Packed model layout and `estream pack` (owner: pack).
estream_add_test(pack_test SOURCES ${CMAKE_SOURCE_DIR}/tests/pack_test.cc
  LIBS estream_pack estream_gguf estream_kernels estream_quant estream_base LABELS pack io sanitize)
