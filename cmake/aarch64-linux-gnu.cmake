# Cross-build for 64-bit ARM Linux with Debian's cross toolchain and multiarch :arm64 libraries
# (scripts/setup.sh --arm64 installs both). Used by scripts/build_arm64.sh:
#   cmake -S . -B build-arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Test binaries run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), so `ctest --test-dir
# build-arm64` works on an x86-64 host; qemu's default CPU ("max") has NEON, dotprod and i8mm.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(ESTREAM_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${ESTREAM_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${ESTREAM_CROSS_TRIPLE}-g++)

# Libraries and headers: the cross toolchain's sysroot (/usr/aarch64-linux-gnu) plus Debian's
# multiarch directories. Header-only packages (nlohmann-json, CLI11) install their CMake configs
# under /usr/share, which is architecture-independent, so the build host's copy serves.
set(CMAKE_FIND_ROOT_PATH /usr/${ESTREAM_CROSS_TRIPLE} /usr)
set(CMAKE_LIBRARY_ARCHITECTURE ${ESTREAM_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# pkg-config must see only the arm64 .pc files (and the architecture-independent ones).
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${ESTREAM_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Run cross-built test binaries (and gtest_discover_tests' listing step) under qemu-user. -L
# gives the root the guest's dynamic loader is looked up in: "/" when the multiarch libc6:arm64
# is installed (it comes with the :arm64 -dev packages), so that the loader and the libc it loads
# are one build; the cross sysroot's loader (/usr/aarch64-linux-gnu) with the multiarch libc hung
# every binary that started a second thread (Debian 12, qemu 7.2): that loader is libc6-arm64-cross
# 2.36-8cross1, the libc.so.6 it then finds (through the host's /etc/ld.so.cache) is libc6:arm64
# 2.36-9+deb12u14, two glibc builds that share private loader/libc interfaces; under -strace the
# process spins in pthread_create after its rt_sigprocmask, before mapping the new thread's stack.
find_program(ESTREAM_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(ESTREAM_QEMU_AARCH64)
  if(EXISTS /lib/ld-linux-aarch64.so.1)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${ESTREAM_QEMU_AARCH64} -L /)
  else()
    set(CMAKE_CROSSCOMPILING_EMULATOR ${ESTREAM_QEMU_AARCH64} -L /usr/${ESTREAM_CROSS_TRIPLE})
  endif()
endif()
