# Calibration request, measured runs, in-place metadata updates, `estream sweep` (owner: sweep).
estream_add_test(calibration_test SOURCES ${CMAKE_SOURCE_DIR}/tests/calibration_test.cc
  LIBS estream_profiler estream_model estream_pack estream_tokenizer LABELS profiler)
estream_add_test(io_metadata_update_test SOURCES ${CMAKE_SOURCE_DIR}/tests/io_metadata_update_test.cc
  LIBS estream_pack estream_model estream_gguf LABELS io pack)
