// SPDX-License-Identifier: Apache-2.0
// bytes -> Event.  libbpf-tools' habit: reject a record shorter than its
// struct, copy it into a local (no unaligned reads of the ring buffer), decode.
#include <cstring>

#include "events.hpp"

namespace commdbg::capture {

namespace {

DecodeResult fail(DecodeError e) {
    DecodeResult r;
    r.error = e;
    return r;
}

DecodeResult ok(Event ev) {
    DecodeResult r;
    r.event.emplace(std::move(ev));
    return r;
}

size_t body_size(uint16_t kind) {
    switch (kind) {
    case CD_EV_CALL_ENTER: return sizeof(cd_call_enter);
    case CD_EV_CALL_EXIT: return sizeof(cd_call_exit);
    case CD_EV_CALL: return sizeof(cd_call);
    case CD_EV_DL_CHANGE:
    case CD_EV_EXEC: return sizeof(cd_dl_change);
    case CD_EV_PROC_FORK:
    case CD_EV_PROC_EXIT:
    case CD_EV_PROC_SEEN: return sizeof(cd_proc);
    case CD_EV_THREAD_EXIT: return sizeof(cd_thread_exit);
    default: return 0;
    }
}

bool context_len_ok(size_t len) {
    return len >= sizeof(cd_context) && (len - sizeof(cd_context)) % sizeof(cd_py_frame) == 0 &&
           (len - sizeof(cd_context)) / sizeof(cd_py_frame) <= CD_MAX_PY_FRAMES;
}

// A tail must fill exactly the bytes after the body and have the length its
// kind implies.  Unknown tail kinds (a newer kernel side) are skipped.
bool tail_ok(const cd_header& h, size_t body) {
    if (h.tail_len != h.size - body) return false;
    switch (h.tail_kind) {
    case CD_TAIL_NONE: return h.tail_len == 0;
    case CD_TAIL_UNIQUE_ID: return h.tail_len == CD_UNIQUE_ID_BYTES;
    case CD_TAIL_COMM_LIST:
        return h.tail_len % sizeof(uint64_t) == 0 &&
               h.tail_len <= CD_MAX_COMM_LIST * sizeof(uint64_t);
    case CD_TAIL_CONTEXT: return context_len_ok(h.tail_len);
    case CD_TAIL_TENSORS:
        return h.tail_len >= sizeof(cd_tensors) && context_len_ok(h.tail_len - sizeof(cd_tensors));
    default: return true;
    }
}

// The return half of cd_call_exit and cd_call.
template <typename Rec>
void exit_fields(const cd_header& h, const Rec& e, CallExit& out) {
    out.tgid = h.tgid;
    out.tid = h.tid;
    out.ts_ns = h.ts_ns;
    out.cookie = e.cookie;
    out.enter_ts_ns = e.enter_ts_ns;
    out.ret = e.ret;
    out.out_value = e.out_value;
    out.depth = e.depth;
}

void unique_id_tail(const cd_header& h, std::span<const uint8_t> bytes, size_t body, CallEnter& out) {
    if (h.tail_kind != CD_TAIL_UNIQUE_ID) return;
    out.has_unique_id = true;
    std::memcpy(out.unique_id.data(), bytes.data() + body, CD_UNIQUE_ID_BYTES);
}

// The label and Python stack (events.h, cd_context); false when the tail
// contradicts itself (a frame count the length does not hold, a long label).
bool context_tail(const cd_header& h, std::span<const uint8_t> bytes, size_t body, CallEnter& out) {
    size_t len = h.tail_len;
    if (h.tail_kind == CD_TAIL_TENSORS) {
        cd_tensors t;
        std::memcpy(&t, bytes.data() + body, sizeof(t));
        if (t.ntensors > CD_MAX_TENSORS) return false;
        out.tensors = t;
        body += sizeof(t), len -= sizeof(t);
    } else if (h.tail_kind != CD_TAIL_CONTEXT) {
        return true;
    }
    cd_context c;
    std::memcpy(&c, bytes.data() + body, sizeof(c));
    size_t frames = (len - sizeof(c)) / sizeof(cd_py_frame);
    if (c.nframes != frames || c.label_len > CD_LABEL_MAX || c.py_status > CD_PY_FAULT) return false;
    out.label.assign(c.label, c.label_len);
    out.py_status = c.py_status;
    out.ctx_flags = c.flags;
    out.py_frames.resize(frames);
    if (frames) std::memcpy(out.py_frames.data(), bytes.data() + body + sizeof(c), frames * sizeof(cd_py_frame));
    return true;
}

}  // namespace

const char* to_string(DecodeError e) {
    switch (e) {
    case DecodeError::Truncated: return "truncated record (shorter than the header)";
    case DecodeError::BadSize: return "record size inconsistent with its kind or buffer";
    case DecodeError::UnknownKind: return "unknown record kind";
    case DecodeError::BadTail: return "tail length inconsistent with its kind or the record size";
    }
    return "unknown decode error";
}

DecodeResult decode(std::span<const uint8_t> bytes) {
    cd_header h;
    if (bytes.size() < sizeof(h)) return fail(DecodeError::Truncated);
    std::memcpy(&h, bytes.data(), sizeof(h));
    size_t body = body_size(h.kind);
    if (body == 0) return fail(DecodeError::UnknownKind);
    if (h.size > bytes.size() || h.size < body) return fail(DecodeError::BadSize);
    if (!tail_ok(h, body)) return fail(DecodeError::BadTail);

    switch (h.kind) {
    case CD_EV_CALL_ENTER: {
        cd_call_enter e;
        std::memcpy(&e, bytes.data(), sizeof(e));
        // Built in place: CallEnter carries a 128-byte id, copies show in profiles.
        DecodeResult r;
        auto& out = std::get<CallEnter>(r.event.emplace(std::in_place_type<CallEnter>));
        call_entry_fields(e, h.tgid, h.tid, h.ts_ns, out);
        unique_id_tail(h, bytes, body, out);
        if (!context_tail(h, bytes, body, out)) return fail(DecodeError::BadTail);
        return r;
    }
    case CD_EV_CALL_EXIT: {
        cd_call_exit e;
        std::memcpy(&e, bytes.data(), sizeof(e));
        CallExit out;
        exit_fields(h, e, out);
        return ok(out);
    }
    case CD_EV_CALL: {
        cd_call e;
        std::memcpy(&e, bytes.data(), sizeof(e));
        DecodeResult r;
        auto& out = std::get<Call>(r.event.emplace(std::in_place_type<Call>));
        call_entry_fields(e, h.tgid, h.tid, e.enter_ts_ns, out.enter);
        unique_id_tail(h, bytes, body, out.enter);
        if (!context_tail(h, bytes, body, out.enter)) return fail(DecodeError::BadTail);
        exit_fields(h, e, out.exit);
        return r;
    }
    case CD_EV_DL_CHANGE:
    case CD_EV_EXEC: {
        cd_dl_change e;
        std::memcpy(&e, bytes.data(), sizeof(e));
        return ok(DlChange{h.tgid, h.tid, h.ts_ns, e.stopped != 0, h.kind == CD_EV_EXEC, e.uid});
    }
    case CD_EV_PROC_FORK: {
        cd_proc e;
        std::memcpy(&e, bytes.data(), sizeof(e));
        return ok(ProcFork{h.tgid, e.parent_tgid, h.ts_ns});
    }
    case CD_EV_PROC_EXIT: {
        cd_proc e;
        std::memcpy(&e, bytes.data(), sizeof(e));
        return ok(ProcExit{h.tgid, h.ts_ns, e.exit_code});
    }
    case CD_EV_PROC_SEEN: return ok(ProcSeen{h.tgid, h.ts_ns});
    case CD_EV_THREAD_EXIT: {
        cd_thread_exit e;
        std::memcpy(&e, bytes.data(), sizeof(e));
        return ok(ThreadExit{h.tgid, h.tid, h.ts_ns, std::string(e.name, strnlen(e.name, sizeof(e.name)))});
    }
    }
    return fail(DecodeError::UnknownKind);
}

}  // namespace commdbg::capture
