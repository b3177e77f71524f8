# Expert virtualization end to end (owner: vmem2): schedules x configurations vs the resident
# run, error paths, budget, stress with random delays (label tsan: scripts/test.sh also runs it
# under ThreadSanitizer).
estream_add_test(pipeline_engine_test SOURCES ${CMAKE_SOURCE_DIR}/tests/pipeline_engine_test.cc
  LIBS estream_model estream_pack LABELS pipeline tsan)
