// SPDX-License-Identifier: Apache-2.0
// Decoded events: what the ring buffer carries, as plain C++ values.
// decode() is a pure function from bytes to one of these; the model is a pure
// function of a stream of them, so both are tested without BPF.
#pragma once

#include <array>
#include <cstring>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "events.h"

namespace commdbg::capture {

// Record sizes are checked in events.h itself, on both sides.

struct CallEnter {
    uint32_t tgid = 0;
    uint32_t tid = 0;
    uint64_t ts_ns = 0;
    uint64_t cookie = 0;
    uint64_t ip = 0;
    uint64_t sp = 0;
    std::array<uint64_t, CD_NUM_ARGS> args{};
    uint32_t group_depth = 0;
    uint32_t frame_depth = CD_DEPTH_UNKNOWN;  // kernel's open-frame count after popping
    bool stack_args = true;                   // args[6], args[7] hold the caller's stack words (CD_ENTRY_STACK_ARGS)
    bool has_unique_id = false;
    std::array<uint8_t, CD_UNIQUE_ID_BYTES> unique_id{};
    // CD_TAIL_CONTEXT (events.h, cd_context): framework context.
    std::string label;                   // a scope's label (SCOPE_LABEL); empty: none
    uint16_t py_status = CD_PY_NONE;     // cd_py_status
    uint16_t ctx_flags = 0;              // CD_CTX_*
    std::vector<cd_py_frame> py_frames;  // the calling thread's Python stack, innermost first
    // CD_TAIL_TENSORS (events.h, cd_tensors): a c10d method's tensors and group, as read.
    std::optional<cd_tensors> tensors;
};

struct CallExit {
    uint32_t tgid = 0;
    uint32_t tid = 0;
    uint64_t ts_ns = 0;
    uint64_t cookie = 0;
    uint64_t enter_ts_ns = 0;
    int64_t ret = 0;
    uint64_t out_value = 0;  // communicator written through the out pointer
    uint32_t depth = 0;
};

// A return-probed call, sent once at its return (cd_call): both halves.
struct Call {
    CallEnter enter;
    CallExit exit;
};

// The loader changed the link map, or (exec) the process exec'd: either may
// bring files to probe, the new loader of an exec among them.
struct DlChange {
    uint32_t tgid = 0;
    uint32_t tid = 0;
    uint64_t ts_ns = 0;
    bool stopped = false;
    bool exec = false;
    uint32_t uid = 0;  // the process's real uid
};

struct ProcFork {
    uint32_t tgid = 0;  // the child
    uint32_t parent_tgid = 0;
    uint64_t ts_ns = 0;
};

struct ProcExit {
    uint32_t tgid = 0;
    uint64_t ts_ns = 0;
    int32_t exit_code = 0;
};

struct ThreadExit {  // a thread that made probed calls exited, with its last name
    uint32_t tgid = 0;
    uint32_t tid = 0;
    uint64_t ts_ns = 0;
    std::string name;
};

struct ProcSeen {  // count-all mode: a process made its first probed call
    uint32_t tgid = 0;
    uint64_t ts_ns = 0;
};

using Event = std::variant<CallEnter, CallExit, Call, DlChange, ProcFork, ProcExit, ProcSeen, ThreadExit>;

// Why a record could not be decoded; each cause is counted, never hidden.
enum class DecodeError { Truncated, BadSize, UnknownKind, BadTail };
const char* to_string(DecodeError e);

struct DecodeResult {
    std::optional<Event> event;
    DecodeError error = DecodeError::Truncated;  // meaningful when !event
};

DecodeResult decode(std::span<const uint8_t> bytes);

// The entry half of a call from a kernel struct that names its fields as
// cd_call_enter does: the ring buffer's cd_call_enter and cd_call (decode())
// and the threads map's cd_inflight (BpfSession::open_calls()) alike.
template <typename Rec>
void call_entry_fields(const Rec& r, uint32_t tgid, uint32_t tid, uint64_t enter_ts, CallEnter& out) {
    out.tgid = tgid;
    out.tid = tid;
    out.ts_ns = enter_ts;
    out.cookie = r.cookie;
    out.ip = r.ip;
    out.sp = r.sp;
    std::memcpy(out.args.data(), r.args, sizeof(r.args));
    out.group_depth = r.group_depth;
    out.frame_depth = r.frame_depth;
    out.stack_args = r.entry_flags & CD_ENTRY_STACK_ARGS;
}

// The value of argument slot `slot` of a call's entry; false for a stack
// word the kernel did not read (CD_TRACE_STACK_ARGS) or no such slot.
inline bool slot_value(const CallEnter& e, uint8_t slot, uint64_t& out) {
    if (slot >= CD_NUM_ARGS || (slot >= CD_REG_SLOTS && !e.stack_args)) return false;
    out = e.args[slot];
    return true;
}

// A stack that shows the whole Python side of the thread: one cut at
// max_frames or by a fault lacks the outermost frames, so its depths and
// its root module cannot be compared with other stacks'.
inline bool py_stack_complete(const CallEnter& e) {
    return e.py_status == CD_PY_NO_TSTATE || (e.py_status == CD_PY_OK && !(e.ctx_flags & CD_CTX_TRUNCATED));
}

// The entry of a call event (CallEnter, or a Call's), else nullptr.
inline const CallEnter* entry_of(const Event& ev) {
    if (auto* e = std::get_if<CallEnter>(&ev)) return e;
    if (auto* c = std::get_if<Call>(&ev)) return &c->enter;
    return nullptr;
}

}  // namespace commdbg::capture
