# Expert virtualization building blocks (owner: vmem): arena, residency table, file + loader.
# vmem_stress_test is labelled tsan: scripts/test.sh also builds and runs it under ThreadSanitizer.
estream_add_test(vmem_arena_test SOURCES ${CMAKE_SOURCE_DIR}/tests/vmem_arena_test.cc
  LIBS estream_vmem LABELS vmem sanitize)
estream_add_test(vmem_residency_test SOURCES ${CMAKE_SOURCE_DIR}/tests/vmem_residency_test.cc
  LIBS estream_vmem LABELS vmem sanitize tsan)
estream_add_test(io_file_test SOURCES ${CMAKE_SOURCE_DIR}/tests/io_file_test.cc
  LIBS estream_io LABELS vmem io sanitize)
estream_add_test(io_loader_test SOURCES ${CMAKE_SOURCE_DIR}/tests/io_loader_test.cc
  LIBS estream_vmem estream_io LABELS vmem io sanitize tsan)
estream_add_test(vmem_stress_test SOURCES ${CMAKE_SOURCE_DIR}/tests/vmem_stress_test.cc
  LIBS estream_vmem estream_io LABELS vmem tsan)
