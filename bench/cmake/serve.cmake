# Load generator for `estream serve` (docs/PERFORMANCE.md, "estream serve"): not a Google
# Benchmark binary, a client that reports throughput and latency percentiles per concurrency.
add_executable(serve_load ${CMAKE_SOURCE_DIR}/bench/serve_load.cc)
target_link_libraries(serve_load PRIVATE PkgConfig::HTTPLIB nlohmann_json::nlohmann_json Threads::Threads)
