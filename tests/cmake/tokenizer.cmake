# Tokenizer tests (owner: tokenizer). Uses ../shared/testdata/tokenizer via ESTREAM_SHARED_DIR.
estream_add_test(tokenizer_test SOURCES ${CMAKE_SOURCE_DIR}/tests/tokenizer_test.cc
  LIBS estream_tokenizer estream_gguf estream_quant estream_base LABELS tokenizer)
