# Expert loader bandwidth (owner: vmem): the "I/O" section of docs/PERFORMANCE.md.
add_executable(io_bench ${CMAKE_SOURCE_DIR}/bench/io_bench.cc)
target_link_libraries(io_bench PRIVATE estream_vmem estream_io estream_base CLI11::CLI11)
