#include <gtest/gtest.h>
TEST(GgufCorrupt, Placeholder) {}
