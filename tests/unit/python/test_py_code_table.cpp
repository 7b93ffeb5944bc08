// SPDX-License-Identifier: Apache-2.0
// What the kernel's frame walker is told of code objects (events.h,
// cd_py_codes; userspace/python/py_code_table.hpp): a kind per code object, found
// by the walker's own lookup (cd_py_code_lookup), so that it reads `self`'s
// type only where a record can use it.  A code object the table does not
// hold -- never noted, dropped, given up for another, or at an address the
// kind bits would spoil -- is unknown, and unknown frames are read.
#include <gtest/gtest.h>

#include "py_code_table.hpp"

namespace commdbg::python {
namespace {

// Code objects whose addresses share a bucket (the walker's hash).
std::vector<uint64_t> same_bucket(uint64_t first, size_t n) {
    std::vector<uint64_t> out{first};
    for (uint64_t c = first + 16; out.size() < n; c += 16)
        if (cd_py_code_bucket(c) == cd_py_code_bucket(first)) out.push_back(c);
    return out;
}

TEST(PyCodeKind, ModuleCallsAndScopeEntersNeedSelfBackwardEntriesMarkTheEngine) {
    EXPECT_EQ(py_code_kind(PyFrameKind::ModuleCall, 2), CD_CODE_SELF);
    EXPECT_EQ(py_code_kind(PyFrameKind::RecordFunctionEnter, 1), CD_CODE_SELF);
    EXPECT_EQ(py_code_kind(PyFrameKind::BackwardEntry, 3), CD_CODE_BACKWARD);
    EXPECT_EQ(py_code_kind(PyFrameKind::Plain, 1), CD_CODE_PLAIN) << "a method: its self may be a hooked module";
    EXPECT_EQ(py_code_kind(PyFrameKind::Plain, 0), CD_CODE_NO_ARGS) << "localsplus[0] is no argument";
}

TEST(PyCodeTable, TheWalkersLookupFindsWhatWasNoted) {
    PyCodeTable t;
    const uint64_t a = 0x7f0000001230, b = 0x7f0000009870;
    EXPECT_EQ(t.kind(a), CD_CODE_UNKNOWN);
    t.note(a, CD_CODE_SELF, 1);
    t.note(b, CD_CODE_NO_ARGS, 1);
    EXPECT_EQ(cd_py_code_lookup(&t.slots(), a), static_cast<uint32_t>(CD_CODE_SELF));
    EXPECT_EQ(cd_py_code_lookup(&t.slots(), b), static_cast<uint32_t>(CD_CODE_NO_ARGS));
    EXPECT_EQ(t.kind(a + 16), CD_CODE_UNKNOWN) << "another address, even in the same bucket";
    // A slot is the code pointer with the kind in its low bits.
    const uint32_t i = 2 * cd_py_code_bucket(a);
    EXPECT_TRUE(t.slots().slot[i] == (a | CD_CODE_SELF) || t.slots().slot[i + 1] == (a | CD_CODE_SELF));
}

TEST(PyCodeTable, ANewKindReplacesTheOldInPlace) {
    PyCodeTable t;
    const uint64_t a = 0x5550;
    t.note(a, CD_CODE_PLAIN, 1);
    t.note(a, CD_CODE_BACKWARD, 2);
    EXPECT_EQ(t.kind(a), CD_CODE_BACKWARD);
    int held = 0;
    for (uint64_t v : t.slots().slot) held += v != 0;
    EXPECT_EQ(held, 1) << "one slot per code object";
}

TEST(PyCodeTable, AFullBucketGivesUpTheCodeSeenLeastRecently) {
    PyCodeTable t;
    auto c = same_bucket(0x7f1000000000, 3);
    t.note(c[0], CD_CODE_PLAIN, 1);
    t.note(c[1], CD_CODE_PLAIN, 2);
    t.note(c[0], CD_CODE_PLAIN, 3);  // seen again: c[1] is now the oldest
    t.note(c[2], CD_CODE_SELF, 4);
    EXPECT_EQ(t.kind(c[0]), CD_CODE_PLAIN);
    EXPECT_EQ(t.kind(c[1]), CD_CODE_UNKNOWN) << "given up: its frames are read again";
    EXPECT_EQ(t.kind(c[2]), CD_CODE_SELF);
}

TEST(PyCodeTable, ADroppedCodeIsUnknown) {
    PyCodeTable t;
    t.note(0x8880, CD_CODE_NO_ARGS, 1);
    t.drop(0x8880);
    EXPECT_EQ(t.kind(0x8880), CD_CODE_UNKNOWN);
    t.drop(0x9990);  // never noted: nothing happens
    EXPECT_EQ(t.kind(0x9990), CD_CODE_UNKNOWN);
}

TEST(PyCodeTable, PointersTheKindBitsWouldSpoilAreNeverHeld) {
    PyCodeTable t;
    t.note(0, CD_CODE_PLAIN, 1);
    t.note(0x1003, CD_CODE_PLAIN, 1);
    t.note(0x2000, CD_CODE_UNKNOWN, 1);
    EXPECT_FALSE(t.take_changed());
    for (uint64_t v : t.slots().slot) EXPECT_EQ(v, 0u);
    EXPECT_EQ(t.kind(0x1003), CD_CODE_UNKNOWN);
    EXPECT_EQ(t.kind(0x1000), CD_CODE_UNKNOWN) << "not the aligned address either";
}

TEST(PyCodeTable, ChangedOnlyWhenTheKernelWouldSeeADifference) {
    PyCodeTable t;
    EXPECT_FALSE(t.take_changed());
    t.note(0x4440, CD_CODE_PLAIN, 1);
    EXPECT_TRUE(t.take_changed());
    EXPECT_FALSE(t.take_changed()) << "taken";
    t.note(0x4440, CD_CODE_PLAIN, 2);
    EXPECT_FALSE(t.take_changed()) << "seen again, same kind: nothing to send";
    t.drop(0x4440);
    EXPECT_TRUE(t.take_changed());
}

}  // namespace
}  // namespace commdbg::python
