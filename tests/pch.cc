// Compiled only to build the tests' precompiled header (CMakeLists.txt, estream_test_pch).
