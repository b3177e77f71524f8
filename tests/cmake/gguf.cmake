# GGUF reader/writer tests (owner: gguf).
estream_add_test(gguf_test SOURCES ${CMAKE_SOURCE_DIR}/tests/gguf_test.cc LIBS estream_gguf estream_quant estream_base LABELS gguf sanitize)
estream_add_test(gguf_corrupt_test SOURCES ${CMAKE_SOURCE_DIR}/tests/gguf_corrupt_test.cc LIBS estream_gguf estream_quant estream_base LABELS gguf sanitize)
