# Quant formats: dequantisation bit-exact with the shared ggml test vectors, quantiser round trips.
estream_add_test(quant_test SOURCES ${CMAKE_SOURCE_DIR}/tests/quant_test.cc
  LIBS estream_quant estream_base LABELS quant sanitize)
