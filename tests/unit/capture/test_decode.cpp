// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "events.hpp"

using namespace commdbg;
using namespace commdbg::capture;

namespace {

template <typename T>
std::vector<uint8_t> bytes_of(const T& v, size_t tail = 0, uint8_t fill = 0) {
    std::vector<uint8_t> b(sizeof(T) + tail, fill);
    std::memcpy(b.data(), &v, sizeof(T));
    return b;
}

cd_header header(uint16_t kind, size_t size, uint16_t tail_kind = CD_TAIL_NONE,
                 uint16_t tail_len = 0) {
    cd_header h{};
    h.kind = kind;
    h.size = static_cast<uint16_t>(size);
    h.tail_kind = tail_kind;
    h.tail_len = tail_len;
    h.tgid = 100;
    h.tid = 101;
    h.ts_ns = 5555;
    return h;
}

cd_call_enter enter_rec() {
    cd_call_enter e{};
    e.h = header(CD_EV_CALL_ENTER, sizeof(e));
    e.cookie = 0x0123456789abcdefull;
    e.ip = 0x7000;
    e.sp = 0x7ffd0000;
    for (int i = 0; i < CD_NUM_ARGS; ++i) e.args[i] = 10 + i;
    e.group_depth = 2;
    return e;
}

}  // namespace

TEST(Decode, CallEnterCopiesEveryField) {
    auto b = bytes_of(enter_rec());
    auto r = decode(b);
    ASSERT_TRUE(r.event);
    const auto& e = std::get<CallEnter>(*r.event);
    EXPECT_EQ(e.tgid, 100u);
    EXPECT_EQ(e.tid, 101u);
    EXPECT_EQ(e.ts_ns, 5555u);
    EXPECT_EQ(e.cookie, 0x0123456789abcdefull);
    EXPECT_EQ(e.ip, 0x7000u);
    EXPECT_EQ(e.sp, 0x7ffd0000u);
    EXPECT_EQ(e.args[7], 17u);
    EXPECT_EQ(e.group_depth, 2u);
    EXPECT_FALSE(e.has_unique_id);
}

// Whether args[6], args[7] are the caller's stack words is the record's own
// flag (CD_ENTRY_STACK_ARGS), for both record kinds.
TEST(Decode, StackArgsFlagSaysWhetherTheStackWordsWereRead) {
    auto rec = enter_rec();
    rec.entry_flags = 0;
    auto r = decode(bytes_of(rec));
    ASSERT_TRUE(r.event);
    EXPECT_FALSE(std::get<CallEnter>(*r.event).stack_args);
    rec.entry_flags = CD_ENTRY_STACK_ARGS;
    r = decode(bytes_of(rec));
    ASSERT_TRUE(r.event);
    EXPECT_TRUE(std::get<CallEnter>(*r.event).stack_args);

    cd_call c{};
    c.h = header(CD_EV_CALL, sizeof(c));
    c.entry_flags = 0;
    r = decode(bytes_of(c));
    ASSERT_TRUE(r.event);
    EXPECT_FALSE(std::get<Call>(*r.event).enter.stack_args);
    c.entry_flags = CD_ENTRY_STACK_ARGS;
    r = decode(bytes_of(c));
    ASSERT_TRUE(r.event);
    EXPECT_TRUE(std::get<Call>(*r.event).enter.stack_args);
}

TEST(Decode, CallEnterWithUniqueIdTailCopiesTheId) {
    auto rec = enter_rec();
    rec.h = header(CD_EV_CALL_ENTER, sizeof(rec) + 128, CD_TAIL_UNIQUE_ID, 128);
    auto b = bytes_of(rec, 128);
    for (int i = 0; i < 128; ++i) b[sizeof(rec) + i] = static_cast<uint8_t>(200 + i);
    auto r = decode(b);
    ASSERT_TRUE(r.event);
    const auto& e = std::get<CallEnter>(*r.event);
    EXPECT_TRUE(e.has_unique_id);
    EXPECT_EQ(e.unique_id[0], 200);
    EXPECT_EQ(e.unique_id[127], static_cast<uint8_t>(200 + 127));
}

// One record per return-probed call: the entry half keeps the entry's time
// (enter_ts_ns), the exit half the return's (the header), and a model fed the
// pair builds the same record as from two.
TEST(Decode, CallRecordCarriesBothHalvesWithTheirOwnTimes) {
    cd_call c{};
    c.h = header(CD_EV_CALL, sizeof(c) + 128, CD_TAIL_UNIQUE_ID, 128);
    c.cookie = 0x0123456789abcdefull;
    c.ip = 0x7000;
    c.sp = 0x7ffd0000;
    for (int i = 0; i < CD_NUM_ARGS; ++i) c.args[i] = 10 + i;
    c.group_depth = 2;
    c.frame_depth = 3;
    c.enter_ts_ns = 4444;
    c.ret = -4;
    c.out_value = 0xdead;
    c.depth = 1;
    auto b = bytes_of(c, 128);
    for (int i = 0; i < 128; ++i) b[sizeof(c) + i] = static_cast<uint8_t>(i);
    auto r = decode(b);
    ASSERT_TRUE(r.event);
    const auto& call = std::get<Call>(*r.event);
    EXPECT_EQ(call.enter.tgid, 100u);
    EXPECT_EQ(call.enter.tid, 101u);
    EXPECT_EQ(call.enter.ts_ns, 4444u);
    EXPECT_EQ(call.enter.cookie, c.cookie);
    EXPECT_EQ(call.enter.ip, 0x7000u);
    EXPECT_EQ(call.enter.sp, 0x7ffd0000u);
    EXPECT_EQ(call.enter.args[7], 17u);
    EXPECT_EQ(call.enter.group_depth, 2u);
    EXPECT_EQ(call.enter.frame_depth, 3u);
    EXPECT_TRUE(call.enter.has_unique_id);
    EXPECT_EQ(call.enter.unique_id[127], 127);
    EXPECT_EQ(call.exit.ts_ns, 5555u);
    EXPECT_EQ(call.exit.enter_ts_ns, 4444u);
    EXPECT_EQ(call.exit.cookie, c.cookie);
    EXPECT_EQ(call.exit.ret, -4);
    EXPECT_EQ(call.exit.out_value, 0xdeadu);
    EXPECT_EQ(call.exit.depth, 1u);
    EXPECT_EQ(entry_of(*r.event), &call.enter);

    auto shorter = c;
    shorter.h = header(CD_EV_CALL, sizeof(c) - 8);
    EXPECT_EQ(decode(bytes_of(shorter)).error, DecodeError::BadSize);
}

TEST(Decode, DecodesFromAnUnalignedBuffer) {
    auto b = bytes_of(enter_rec());
    std::vector<uint8_t> shifted(b.size() + 1);
    std::memcpy(shifted.data() + 1, b.data(), b.size());
    auto r = decode(std::span<const uint8_t>(shifted).subspan(1));
    ASSERT_TRUE(r.event);
    EXPECT_EQ(std::get<CallEnter>(*r.event).sp, 0x7ffd0000u);
}

TEST(Decode, CallExitDlChangeForkAndExit) {
    cd_call_exit x{};
    x.h = header(CD_EV_CALL_EXIT, sizeof(x));
    x.cookie = 7;
    x.enter_ts_ns = 4444;
    x.ret = -4;
    x.out_value = 0xdead;
    x.depth = 1;
    auto r = decode(bytes_of(x));
    ASSERT_TRUE(r.event);
    const auto& e = std::get<CallExit>(*r.event);
    EXPECT_EQ(e.enter_ts_ns, 4444u);
    EXPECT_EQ(e.ret, -4);
    EXPECT_EQ(e.out_value, 0xdeadu);
    EXPECT_EQ(e.depth, 1u);

    cd_dl_change d{};
    d.h = header(CD_EV_DL_CHANGE, sizeof(d));
    d.stopped = 1;
    r = decode(bytes_of(d));
    ASSERT_TRUE(r.event);
    EXPECT_TRUE(std::get<DlChange>(*r.event).stopped);

    cd_proc f{};
    f.h = header(CD_EV_PROC_FORK, sizeof(f));
    f.parent_tgid = 99;
    r = decode(bytes_of(f));
    ASSERT_TRUE(r.event);
    EXPECT_EQ(std::get<ProcFork>(*r.event).parent_tgid, 99u);
    EXPECT_EQ(std::get<ProcFork>(*r.event).tgid, 100u);

    cd_proc p{};
    p.h = header(CD_EV_PROC_EXIT, sizeof(p));
    p.exit_code = 256;
    r = decode(bytes_of(p));
    ASSERT_TRUE(r.event);
    EXPECT_EQ(std::get<ProcExit>(*r.event).exit_code, 256);
    EXPECT_EQ(std::get<ProcExit>(*r.event).ts_ns, 5555u);
}

// A thread's exit carries its name (task->comm): cut at the first NUL, and
// all 16 bytes when the kernel filled them without one.
TEST(Decode, ThreadExitCarriesTheThreadsName) {
    cd_thread_exit t{};
    t.h = header(CD_EV_THREAD_EXIT, sizeof(t));
    std::memcpy(t.name, "nccl-worker-0", 13);
    auto r = decode(bytes_of(t));
    ASSERT_TRUE(r.event);
    const auto& x = std::get<ThreadExit>(*r.event);
    EXPECT_EQ(x.tgid, 100u);
    EXPECT_EQ(x.tid, 101u);
    EXPECT_EQ(x.name, "nccl-worker-0");
    std::memcpy(t.name, "0123456789abcdef", CD_THREAD_NAME_LEN);
    r = decode(bytes_of(t));
    ASSERT_TRUE(r.event);
    EXPECT_EQ(std::get<ThreadExit>(*r.event).name, "0123456789abcdef");
    t.h.size = sizeof(t) - 1;  // shorter than its body
    EXPECT_FALSE(decode(bytes_of(t)).event);
}

// An exec is a loader change of its own kind (the new image may run another
// loader file): the session scans and resumes as after a dlopen.
TEST(Decode, ExecIsALoaderChangeMarkedExec) {
    cd_dl_change d{};
    d.h = header(CD_EV_EXEC, sizeof(d));
    d.stopped = 1;
    auto r = decode(bytes_of(d));
    ASSERT_TRUE(r.event);
    const auto& e = std::get<DlChange>(*r.event);
    EXPECT_TRUE(e.exec);
    EXPECT_TRUE(e.stopped);
    EXPECT_EQ(e.tgid, 100u);

    d.h = header(CD_EV_DL_CHANGE, sizeof(d));
    r = decode(bytes_of(d));
    ASSERT_TRUE(r.event);
    EXPECT_FALSE(std::get<DlChange>(*r.event).exec);

    d.h = header(CD_EV_EXEC, sizeof(d) - 8);
    EXPECT_FALSE(decode(bytes_of(d)).event) << "a short exec record must not decode";
}

TEST(Decode, ShorterThanHeaderIsTruncated) {
    auto b = bytes_of(enter_rec());
    auto r = decode(std::span<const uint8_t>(b.data(), sizeof(cd_header) - 1));
    EXPECT_FALSE(r.event);
    EXPECT_EQ(r.error, DecodeError::Truncated);
}

TEST(Decode, SizeBeyondBufferOrBelowStructIsBadSize) {
    auto b = bytes_of(enter_rec());
    auto r = decode(std::span<const uint8_t>(b.data(), b.size() - 8));
    EXPECT_EQ(r.error, DecodeError::BadSize);
    EXPECT_FALSE(r.event);

    auto small = enter_rec();
    small.h.size = sizeof(cd_call_enter) - 8;
    r = decode(bytes_of(small));
    EXPECT_FALSE(r.event);
    EXPECT_EQ(r.error, DecodeError::BadSize);
}

TEST(Decode, UnknownKindIsReported) {
    auto rec = enter_rec();
    rec.h.kind = 77;
    auto r = decode(bytes_of(rec));
    EXPECT_FALSE(r.event);
    EXPECT_EQ(r.error, DecodeError::UnknownKind);
}

TEST(Decode, InconsistentTailsAreBadTail) {
    // tail_len disagrees with size
    auto rec = enter_rec();
    rec.h = header(CD_EV_CALL_ENTER, sizeof(rec) + 128, CD_TAIL_UNIQUE_ID, 64);
    auto r = decode(bytes_of(rec, 128));
    EXPECT_FALSE(r.event);
    EXPECT_EQ(r.error, DecodeError::BadTail);
    // unique id tail of the wrong length
    rec.h = header(CD_EV_CALL_ENTER, sizeof(rec) + 64, CD_TAIL_UNIQUE_ID, 64);
    r = decode(bytes_of(rec, 64));
    EXPECT_FALSE(r.event);
    EXPECT_EQ(r.error, DecodeError::BadTail);
    // bytes after the body with no tail kind
    rec.h = header(CD_EV_CALL_ENTER, sizeof(rec) + 8, CD_TAIL_NONE, 0);
    r = decode(bytes_of(rec, 8));
    EXPECT_EQ(r.error, DecodeError::BadTail);
}

TEST(Decode, UnknownTailKindOfRightLengthIsSkipped) {
    auto rec = enter_rec();
    rec.h = header(CD_EV_CALL_ENTER, sizeof(rec) + 16, 9, 16);
    auto r = decode(bytes_of(rec, 16));
    ASSERT_TRUE(r.event);
    EXPECT_FALSE(std::get<CallEnter>(*r.event).has_unique_id);
}

TEST(Decode, ErrorsHaveMessages) {
    for (auto e : {DecodeError::Truncated, DecodeError::BadSize, DecodeError::UnknownKind,
                   DecodeError::BadTail})
        EXPECT_GT(std::strlen(to_string(e)), 5u);
}

namespace {

// An entry record with a context tail: `label`, then `frames` Python frames.
std::vector<uint8_t> context_record(const std::string& label, size_t frames, uint16_t status = CD_PY_OK) {
    cd_context c{};
    size_t tail = sizeof(c) + frames * sizeof(cd_py_frame);
    auto rec = enter_rec();
    rec.h = header(CD_EV_CALL_ENTER, sizeof(rec) + tail, CD_TAIL_CONTEXT, static_cast<uint16_t>(tail));
    c.label_len = static_cast<uint16_t>(label.size());
    std::memcpy(c.label, label.data(), label.size());
    c.nframes = static_cast<uint16_t>(frames);
    c.py_status = status;
    c.flags = CD_CTX_TRUNCATED;
    auto b = bytes_of(rec, tail);
    std::memcpy(b.data() + sizeof(rec), &c, sizeof(c));
    for (size_t i = 0; i < frames; ++i) {
        cd_py_frame f{0x1000 + i, 0x2000 + i, 0x3000 + i, 0x4000 + i};
        std::memcpy(b.data() + sizeof(rec) + sizeof(c) + i * sizeof(f), &f, sizeof(f));
    }
    return b;
}

}  // namespace

TEST(Decode, ContextTailCarriesLabelStatusAndFramesInnermostFirst) {
    auto r = decode(context_record("Optimizer.step#SGD.step", 3));
    ASSERT_TRUE(r.event) << to_string(r.error);
    const auto& e = std::get<CallEnter>(*r.event);
    EXPECT_EQ(e.label, "Optimizer.step#SGD.step");
    EXPECT_EQ(e.py_status, CD_PY_OK);
    EXPECT_EQ(e.ctx_flags, CD_CTX_TRUNCATED);
    ASSERT_EQ(e.py_frames.size(), 3u);
    EXPECT_EQ(e.py_frames[0].code, 0x1000u);
    EXPECT_EQ(e.py_frames[2].self, 0x2002u);
    EXPECT_EQ(e.py_frames[2].self_type, 0x3002u);
    EXPECT_EQ(e.py_frames[1].instr, 0x4001u);
    EXPECT_FALSE(e.has_unique_id);
}

TEST(Decode, AThreadWithoutPythonHasAStatusAndNoFrames) {
    auto r = decode(context_record("", 0, CD_PY_NO_TSTATE));
    ASSERT_TRUE(r.event);
    const auto& e = std::get<CallEnter>(*r.event);
    EXPECT_EQ(e.py_status, CD_PY_NO_TSTATE);
    EXPECT_TRUE(e.py_frames.empty());
    EXPECT_TRUE(e.label.empty());
}

TEST(Decode, AContextTailThatContradictsItselfIsBadTail) {
    auto frames_differ = context_record("x", 2);
    frames_differ[sizeof(cd_call_enter) + 2] = 3;  // nframes 3, length holds 2
    EXPECT_EQ(decode(frames_differ).error, DecodeError::BadTail);
    auto long_label = context_record("x", 1);
    uint16_t too_long = CD_LABEL_MAX + 1;
    std::memcpy(long_label.data() + sizeof(cd_call_enter), &too_long, sizeof(too_long));
    EXPECT_EQ(decode(long_label).error, DecodeError::BadTail);
    auto ragged = context_record("x", 1);
    ragged.push_back(0);  // a partial frame
    cd_header h;
    std::memcpy(&h, ragged.data(), sizeof(h));
    h.size += 1, h.tail_len += 1;
    std::memcpy(ragged.data(), &h, sizeof(h));
    EXPECT_EQ(decode(ragged).error, DecodeError::BadTail);
}

namespace {

// An entry record with a tensors tail (events.h, CD_TAIL_TENSORS): the
// tensors, then a context with `frames` frames.
std::vector<uint8_t> tensors_record(const cd_tensors& t, size_t frames) {
    const size_t tail = sizeof(cd_tensors) + sizeof(cd_context) + frames * sizeof(cd_py_frame);
    cd_call_enter rec = enter_rec();
    rec.h = header(CD_EV_CALL_ENTER, sizeof(rec) + tail, CD_TAIL_TENSORS, static_cast<uint16_t>(tail));
    auto b = bytes_of(rec, tail);
    std::memcpy(b.data() + sizeof(rec), &t, sizeof(t));
    cd_context c{};
    c.nframes = static_cast<uint16_t>(frames);
    c.py_status = frames ? CD_PY_OK : CD_PY_NONE;
    std::memcpy(b.data() + sizeof(rec) + sizeof(t), &c, sizeof(c));
    return b;
}

}  // namespace

TEST(Decode, TensorsTailCarriesTheTensorsAndThenTheContext) {
    cd_tensors t{};
    t.group_rank = 1, t.group_size = 4, t.kinds = CD_TPARAM_VECTOR, t.status = CD_TENSORS_OK, t.ntensors = 1;
    t.total[0] = 1;
    t.t[0].sizes[0] = 3, t.t[0].sizes[1] = 5, t.t[0].numel = 15, t.t[0].ndim = 2, t.t[0].status = CD_TENSOR_OK;
    auto r = decode(tensors_record(t, 2));
    ASSERT_TRUE(r.event) << to_string(r.error);
    const auto& e = std::get<CallEnter>(*r.event);
    ASSERT_TRUE(e.tensors);
    EXPECT_EQ(e.tensors->group_size, 4);
    EXPECT_EQ(e.tensors->t[0].sizes[1], 5);
    EXPECT_EQ(e.py_frames.size(), 2u);  // the context after the tensors
    EXPECT_EQ(e.py_status, CD_PY_OK);
}

TEST(Decode, TensorsTailClaimingMoreTensorsThanItHoldsIsRejected) {
    cd_tensors t{};
    t.ntensors = CD_MAX_TENSORS + 1;
    auto r = decode(tensors_record(t, 0));
    EXPECT_FALSE(r.event);
    EXPECT_EQ(r.error, DecodeError::BadTail);
    // And one too short for its tensors.
    auto b = tensors_record(cd_tensors{}, 0);
    cd_header h;
    std::memcpy(&h, b.data(), sizeof(h));
    h.tail_len = sizeof(cd_tensors) - 8, h.size = static_cast<uint16_t>(sizeof(cd_call_enter) + h.tail_len);
    std::memcpy(b.data(), &h, sizeof(h));
    b.resize(h.size);
    EXPECT_EQ(decode(b).error, DecodeError::BadTail);
}
