# The profiler's disk characterisation and calibration, `estream profile`, prefill --budget from
# the stored profile (owner: profile).
estream_add_test(profiler_disk_test SOURCES ${CMAKE_SOURCE_DIR}/tests/profiler_disk_test.cc
  LIBS estream_profiler estream_model estream_pack LABELS profiler)
estream_add_test(profiler_calibrate_test SOURCES ${CMAKE_SOURCE_DIR}/tests/profiler_calibrate_test.cc
  LIBS estream_profiler estream_model estream_pack estream_tokenizer LABELS profiler)
if(TARGET profiler_calibrate_test)
  add_dependencies(profiler_calibrate_test estream)  # the CLI tests run the binary
endif()
