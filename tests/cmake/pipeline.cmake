# Expert virtualization (owner: vmem2).
# pipeline_engine_test: every schedule x configuration vs the resident run, error paths, budget,
#   engine-level stress with random delays (uses OpenMP, so not under TSan: libgomp is not
#   instrumented). Label sanitize: the whole binary runs under ASan+UBSan in about 10 s on 2
#   cores (-O1; the RSS-vs-budget check is off there, see the test).
# pipeline_stream_test: the streamer alone under random delays, no OpenMP: label tsan
#   (scripts/test.sh also builds and runs it under ThreadSanitizer) and sanitize (ASan+UBSan).
estream_add_test(pipeline_engine_test SOURCES ${CMAKE_SOURCE_DIR}/tests/pipeline_engine_test.cc
  LIBS estream_model estream_pack LABELS pipeline sanitize)
estream_add_test(pipeline_stream_test SOURCES ${CMAKE_SOURCE_DIR}/tests/pipeline_stream_test.cc
  LIBS estream_pipeline estream_model estream_pack LABELS pipeline tsan sanitize)
if(TARGET pipeline_engine_test)
  add_dependencies(pipeline_engine_test estream)  # PeakRssStaysUnderTheBudget runs the CLI
endif()
