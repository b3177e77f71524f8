# Tokenizer tests (owner: tokenizer). Uses ../shared/testdata/tokenizer via ESTREAM_SHARED_DIR.
estream_add_test(tokenizer_test SOURCES ${CMAKE_SOURCE_DIR}/tests/tokenizer_test.cc
  LIBS estream_tokenizer estream_gguf estream_quant estream_base LABELS tokenizer)
# CLI end to end (tokenize, perplexity): runs the built estream binary.
estream_add_test(tokenizer_cli_test SOURCES ${CMAKE_SOURCE_DIR}/tests/tokenizer_cli_test.cc
  LIBS estream_pack_layout estream_gguf estream_quant estream_base nlohmann_json::nlohmann_json LABELS tokenizer)
if(TARGET tokenizer_cli_test)
  add_dependencies(tokenizer_cli_test estream)
endif()
