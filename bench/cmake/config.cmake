# Configurator re-solve time (owner: config): the "Configurator" section of docs/PERFORMANCE.md.
add_executable(config_bench ${CMAKE_SOURCE_DIR}/bench/config_bench.cc)
target_link_libraries(config_bench PRIVATE estream_config estream_gguf estream_base benchmark::benchmark)
