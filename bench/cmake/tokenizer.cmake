# Tokenizer throughput (owner: tokenizer). Reads the shared vocabularies; $ESTREAM_SHARED_DIR overrides.
add_executable(tokenizer_bench ${CMAKE_SOURCE_DIR}/bench/tokenizer_bench.cc)
target_link_libraries(tokenizer_bench PRIVATE estream_tokenizer estream_gguf estream_quant estream_base
  benchmark::benchmark)
target_compile_definitions(tokenizer_bench PRIVATE ESTREAM_SHARED_DIR="${ESTREAM_SHARED_DIR}")
