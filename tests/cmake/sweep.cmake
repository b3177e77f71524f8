# Calibration request, measured runs, in-place metadata updates, `estream sweep` (owner: sweep).
estream_add_test(calibration_test SOURCES ${CMAKE_SOURCE_DIR}/tests/calibration_test.cc
  LIBS estream_profiler estream_model estream_pack estream_tokenizer LABELS profiler)
