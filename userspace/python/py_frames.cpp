// SPDX-License-Identifier: Apache-2.0
// LivePyResolver::Process's frame naming: code objects (cached, re-validated
// once a batch), their line tables, and the frame a record shows.
#include <algorithm>
#include <array>
#include <atomic>

#include "py_process.hpp"

namespace commdbg::python {
namespace {

using namespace pyobj;

const PyFrameInfo kUnknownFrame{};

bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// The runtime's own files, torch's and installed packages': not user code.
bool library_file(std::string_view file, int minor) {
    if (file.rfind("<frozen ", 0) == 0) return true;
    const std::string stdlib = "/python3." + std::to_string(minor) + "/";
    return contains(file, "/lib" + stdlib) || contains(file, "/lib64" + stdlib) || contains(file, "/site-packages/") ||
           contains(file, "/dist-packages/") || contains(file, "/torch/") || file.rfind("torch/", 0) == 0;
}

// 3.10 has co_name only: the bare method name, confirmed by the file (and,
// for __enter__, by the type of self in frame()).
PyFrameKind kind_of(std::string_view q, std::string_view file, int minor) {
    auto is = [&](std::string_view cls, std::string_view fn) {
        if (minor == 10) return q == fn;
        return q.size() == cls.size() + 1 + fn.size() && q.substr(0, cls.size()) == cls && q[cls.size()] == '.' &&
               q.substr(cls.size() + 1) == fn;
    };
    const bool call = is("Module", "_call_impl") || is("Module", "_wrapped_call_impl");
    if (call && ends_with(file, "torch/nn/modules/module.py")) return PyFrameKind::ModuleCall;
    if (ends_with(file, "torch/autograd/profiler.py") && is("record_function", "__enter__"))
        return PyFrameKind::RecordFunctionEnter;
    if (ends_with(file, "torch/autograd/graph.py") && q == "_engine_run_backward") return PyFrameKind::BackwardEntry;
    if (ends_with(file, "torch/autograd/__init__.py") && (q == "backward" || q == "grad"))
        return PyFrameKind::BackwardEntry;
    // 3.10's bare "apply" is also Function.apply (a classmethod: its first local is cls, not self).
    if (ends_with(file, "torch/autograd/function.py") && is("BackwardCFunction", "apply"))
        return PyFrameKind::FunctionApply;
    return PyFrameKind::Plain;
}

// ---- line tables ----------------------------------------------------------

// 3.10 (PEP 626): (bytecode delta, signed line delta) byte pairs; -128 is "no line".
int line_310(std::string_view t, uint32_t first, int64_t offset) {
    int64_t start = 0, line = first;
    for (size_t i = 0; i + 1 < t.size(); i += 2) {
        int64_t end = start + static_cast<uint8_t>(t[i]);
        int8_t ldelta = static_cast<int8_t>(t[i + 1]);
        if (ldelta != -128) line += ldelta;
        if (offset >= start && offset < end) return ldelta == -128 ? -1 : static_cast<int>(line);
        start = end;
    }
    return -1;
}

// 3.11+ (Objects/locations.md): an entry's first byte has bit 7 set, its
// code in bits 3-6 and (code units - 1) in bits 0-2; varints are 6-bit chunks.
int line_311(std::string_view t, uint32_t first, int64_t offset) {
    auto byte = [&](size_t i) { return i < t.size() ? static_cast<uint8_t>(t[i]) : 0; };
    auto signed_varint = [&](size_t i) {
        uint32_t v = byte(i) & 63, shift = 0;
        while ((byte(i) & 64) && shift < 30) v |= (byte(++i) & 63u) << (shift += 6);
        return (v & 1) ? -static_cast<int64_t>(v >> 1) : static_cast<int64_t>(v >> 1);
    };
    int64_t start = 0, line = first;
    for (size_t i = 0; i < t.size();) {
        uint8_t b = byte(i);
        int code = (b >> 3) & 15;
        int64_t end = start + 2 * ((b & 7) + 1);
        if (code == 13 || code == 14) line += signed_varint(i + 1);
        else if (code == 11 || code == 12) line += code - 10;
        if (offset >= start && offset < end) return code == 15 ? -1 : static_cast<int>(line);
        start = end;
        for (++i; i < t.size() && !(byte(i) & 128); ++i) {}
    }
    return -1;
}

}  // namespace

uint32_t py_line_of(int minor, std::string_view linetable, uint32_t firstlineno, int64_t offset) {
    if (offset < 0) return firstlineno;
    int line = minor == 10 ? line_310(linetable, firstlineno, offset) : line_311(linetable, firstlineno, offset);
    return line > 0 ? static_cast<uint32_t>(line) : firstlineno;
}

using namespace pyobj;

// ---- code objects and frames ---------------------------------------------

// The words a code object is known by, in one read: refcount, type, names,
// line table, argcount, first line.  False when it is not a live code object.
uint32_t LivePyResolver::Process::code_head_bytes() const {
    const PyLayout& l = d_.layout;
    const uint32_t name_at = l.minor == 10 ? l.code_name : l.code_qualname;
    return std::max({name_at, l.code_filename, l.code_localsplusnames, o_.code_linetable}) + 8;
}

bool LivePyResolver::Process::parse_code_head(const uint8_t* b, CodeHead& h) const {
    const PyLayout& l = d_.layout;
    if (!plausible_refcnt(field<uint64_t>(b, 0)) || field<uint64_t>(b, l.ob_type) != l.code_type_addr) return false;
    h.name = field<uint64_t>(b, l.minor == 10 ? l.code_name : l.code_qualname);
    h.filename = field<uint64_t>(b, l.code_filename);
    h.linetable = field<uint64_t>(b, o_.code_linetable);
    h.varnames = field<uint64_t>(b, l.code_localsplusnames);
    h.argcount = field<int32_t>(b, l.code_argcount);
    int32_t first = field<int32_t>(b, l.code_firstlineno);
    h.firstlineno = first > 0 ? static_cast<uint32_t>(first) : 0;
    h.code_bytes = l.minor == 10 ? -1 : 2 * field<int64_t>(b, kObSize);
    return true;
}

bool LivePyResolver::Process::code_head(uint64_t ptr, CodeHead& h) {
    std::array<uint8_t, kCodeHeadMax> b{};
    const uint32_t len = code_head_bytes();
    return len <= b.size() && mem_->read(ptr, b.data(), len) && parse_code_head(b.data(), h);
}

bool LivePyResolver::Process::read_code(uint64_t ptr, Code& c) {
    if (!code_head(ptr, c.head)) return false;
    auto q = str(c.head.name), f = str(c.head.filename);
    if (!q || !f) return false;
    c.qualname = std::move(*q), c.file = std::move(*f);
    if (auto names = tuple_items(c.head.varnames, 1); names && !names->empty())
        c.first_local = str(names->front()).value_or("");
    c.kind = kind_of(c.qualname, c.file, d_.layout.minor);
    c.library = library_file(c.file, d_.layout.minor);
    c.serial = ++serials_;
    return true;
}

LivePyResolver::Process::Code* LivePyResolver::Process::mark_used(uint64_t ptr, Code& c) {
    if (c.used != epoch_ && used_.size() < kRevalidateMax) {
        c.used = epoch_;
        used_.push_back(ptr);
    }
    return &c;
}

void LivePyResolver::Process::revalidate_used(uint64_t e) {
    std::vector<uint64_t> last;
    last.swap(used_);
    epoch_ = e;
    const uint32_t len = code_head_bytes();
    if (last.empty() || !d_.ok() || len > kCodeHeadMax) return;
    std::vector<uint8_t> heads(last.size() * len);
    std::vector<host::RemoteMemory::Range> ranges;
    ranges.reserve(last.size());
    for (size_t i = 0; i < last.size(); ++i) ranges.push_back({last[i], heads.data() + i * len, len});
    // A range that fails (a page unmapped since) is left to code(), which
    // tells a changed object from an exited process; the rest read on.
    for (size_t i = 0; i < ranges.size();) {
        const size_t read = mem_->read_prefix(std::span(ranges).subspan(i));
        for (size_t k = i; k < i + read; ++k) {
            auto it = codes_.find(last[k]);
            CodeHead now;
            if (it == codes_.end() || !parse_code_head(heads.data() + k * len, now) || !now.same_object(it->second.head))
                continue;  // code() reads it again and drops it
            it->second.checked = epoch_;
            table_.note(last[k], py_code_kind(it->second.kind, it->second.head.argcount), epoch_);
        }
        if (i + read < ranges.size() && mem_->gone()) break;  // exited: every later read fails alike
        i += read + 1;
    }
}

// Cached per pointer; each use re-reads the words it was validated by (once
// per batch: revalidate_used), so a freed code object (its refcount word now
// the allocator's) or another object at the same address is noticed.
LivePyResolver::Process::Code* LivePyResolver::Process::code(uint64_t ptr) {
    if (!d_.ok() || !arch::is_user_address(ptr)) return nullptr;
    if (auto it = codes_.find(ptr); it != codes_.end()) {
        Code& c = it->second;
        if (c.checked == epoch_) return mark_used(ptr, c);
        if (CodeHead now; code_head(ptr, now) && now.same_object(c.head)) {
            c.checked = epoch_;
            table_.note(ptr, py_code_kind(c.kind, c.head.argcount), epoch_);
            return mark_used(ptr, c);
        }
        // Unreadable now, not changed: the process exited (or is exiting)
        // since the kernel saw a frame run this very code.  The last name
        // validated stands; records read after a fast exit keep their names.
        if (uint64_t w = 0; !mem_->get(ptr, w) && mem_->gone()) return &c;
        release(c.bytes);
        codes_.erase(it);
        table_.drop(ptr);
    }
    Code c;
    if (!read_code(ptr, c)) return nullptr;
    c.checked = epoch_;
    c.bytes = kEntryOverhead + sizeof(std::pair<uint64_t, Code>) + heap_of(c.qualname) + heap_of(c.file) +
              heap_of(c.first_local);
    if (!charge(c.bytes)) {
        ++account_.stats->unnamed_frames;
        return nullptr;
    }
    table_.note(ptr, py_code_kind(c.kind, c.head.argcount), epoch_);
    return mark_used(ptr, codes_.insert_or_assign(ptr, std::move(c)).first->second);
}

uint32_t LivePyResolver::Process::line_of(Code& c, uint64_t code_ptr, uint64_t instr) {
    int64_t offset = -1;
    if (d_.layout.minor == 10) {
        int32_t lasti = static_cast<int32_t>(instr);  // f_lasti: an instruction index
        if (lasti >= 0) offset = 2 * static_cast<int64_t>(lasti);
    } else if (uint64_t base = code_ptr + o_.code_adaptive; instr >= base) {
        if (instr - base < static_cast<uint64_t>(c.head.code_bytes)) offset = static_cast<int64_t>(instr - base);
    }
    if (offset < 0) return c.head.firstlineno;
    if (auto it = c.lines.find(offset); it != c.lines.end()) return it->second;
    // A table that does not fit is read for this line and not kept.
    std::string scratch;
    if (!c.table) {
        uint64_t h[3] = {0, 0, 0};  // refcnt, type, ob_size
        if (mem_->read(c.head.linetable, h, sizeof h) && has_flag(h[1], kFlagBytes) && h[2] <= kMaxLinetable) {
            scratch.resize(h[2]);
            if (!scratch.empty() && !mem_->read(c.head.linetable + kBytesData, scratch.data(), scratch.size()))
                scratch.clear();
        }
        if (charge(heap_of(scratch))) c.bytes += heap_of(scratch), c.table = std::move(scratch);
    }
    uint32_t line = py_line_of(d_.layout.minor, c.table ? *c.table : scratch, c.head.firstlineno, offset);
    constexpr size_t kLineBytes = kEntryOverhead + sizeof(std::pair<int64_t, uint32_t>);
    if (c.lines.size() < 4096 && charge(kLineBytes)) c.bytes += kLineBytes, c.lines.emplace(offset, line);
    return line;
}

// record_function.__enter__'s `self.name`, read while the frame is live (the
// object is short-lived: its address is reused by the next record_function).
std::string LivePyResolver::Process::frame_label(const cd_py_frame& f) {
    uint64_t now_type = 0;
    if (!header(f.self, now_type) || now_type != f.self_type) return {};
    return str(attr(f.self, "name")).value_or("");
}

const PyFrameInfo& LivePyResolver::Process::frame(const cd_py_frame& f) {
    Code* c = code(f.code);  // stays put: nothing below touches other code objects
    if (c == nullptr) return kUnknownFrame;
    const uint32_t line = line_of(*c, f.code, f.instr);
    PyFrameKind kind = c->kind;
    const Type* st = c->head.argcount >= 1 && f.self != 0 ? type(f.self_type) : nullptr;
    const uint64_t st_serial = st != nullptr ? st->serial : 0;
    const std::string st_name = st != nullptr ? st->facts.name : "";
    const bool mod = st != nullptr && (st->mro_done ? st->facts.is_module : is_module(f.self_type));
    const uint64_t module = mod ? f.self : 0;
    std::string label;
    if (kind == PyFrameKind::RecordFunctionEnter) {
        if ((d_.layout.minor == 10 && st_name != "record_function") || c->first_local != "self") kind = PyFrameKind::Plain;
        else label = frame_label(f);
    }
    if (kind == PyFrameKind::FunctionApply) {
        if (c->first_local != "self" || st_name.empty()) kind = PyFrameKind::Plain;
        else label = st_name;
    }
    // Past kMaxFrames only labels are dropped: the rest is bounded by the program's code and modules.
    if (frames_.size() >= kMaxFrames && !label.empty()) {
        ++account_.stats->dropped_labels;
        label = std::string();
    }
    FrameKey key{c->serial, line, kind, module, module != 0 ? st_serial : 0, label};
    if (auto it = frames_.find(key); it != frames_.end()) return it->second;
    PyFrameInfo info;
    info.qualname = c->qualname, info.file = c->file, info.line = line, info.known = true;
    info.kind = kind, info.module = module, info.module_class = module != 0 ? st_name : "";
    info.label = std::move(label), info.library = c->library;
    return keep_frame(std::move(key), std::move(info));
}

// The stack of a thread's record, innermost first.  Most records of a thread
// repeat its last stack (a loop calls a collective from the same line), and
// within a batch code objects and types are trusted as validated once
// (begin_batch), so the same raw frames name the same frames: the thread's
// last stack is kept and given again, not named frame by frame.  Not kept:
// a stack with a frame named from a live object (a record_function's label,
// an autograd Function's class and its label's accounting) or left unnamed
// (its code may be read next time).  Bounded: kStackMemos threads' stacks
// of at most CD_MAX_PY_FRAMES frames, accounted once.  Returns the kept
// stack's serial, 0 for a stack not kept.
uint64_t LivePyResolver::Process::stack(uint32_t tid, std::span<const cd_py_frame> raw,
                                        std::vector<const PyFrameInfo*>& out) {
    // Program-wide, and commdbgd runs sessions on several threads: a serial
    // never names two stacks.
    static std::atomic<uint64_t> serials{0};
    StackMemo& m = memos_[tid % kStackMemos];
    if (m.epoch == epoch_ && m.tid == tid && m.raw.size() == raw.size() &&
        std::equal(raw.begin(), raw.end(), m.raw.begin(), [](const cd_py_frame& a, const cd_py_frame& b) {
            return a.code == b.code && a.instr == b.instr && a.self == b.self && a.self_type == b.self_type;
        })) {
        out = m.named;
        return m.serial;
    }
    out.clear();
    bool keep = raw.size() <= CD_MAX_PY_FRAMES;
    for (const cd_py_frame& f : raw) {
        const PyFrameInfo& info = frame(f);
        keep = keep && info.known && info.kind != PyFrameKind::RecordFunctionEnter &&
               info.kind != PyFrameKind::FunctionApply;
        out.push_back(&info);
    }
    m.epoch = 0;
    constexpr size_t kMemoBytes = kStackMemos * CD_MAX_PY_FRAMES * (sizeof(cd_py_frame) + sizeof(PyFrameInfo*));
    if (!keep || (!memos_charged_ && !(memos_charged_ = charge(kMemoBytes)))) return 0;
    m.tid = tid, m.epoch = epoch_, m.serial = ++serials;
    m.raw.reserve(CD_MAX_PY_FRAMES), m.named.reserve(CD_MAX_PY_FRAMES);
    m.raw.assign(raw.begin(), raw.end());
    m.named = out;
    return m.serial;
}

// A new entry; past the bytes bound the same frame without its label, where
// it fits or is there; else the frame goes unnamed.
const PyFrameInfo& LivePyResolver::Process::keep_frame(FrameKey key, PyFrameInfo info) {
    auto cost = [](const FrameKey& k, const PyFrameInfo& i) {
        return kEntryOverhead + sizeof(std::pair<const FrameKey, PyFrameInfo>) + heap_of(std::get<5>(k)) + cost_of(i);
    };
    if (charge(cost(key, info))) return frames_.emplace(std::move(key), std::move(info)).first->second;
    if (!info.label.empty()) {
        ++account_.stats->dropped_labels;
        std::get<5>(key) = std::string(), info.label = std::string();
        if (auto it = frames_.find(key); it != frames_.end()) return it->second;
        if (charge(cost(key, info))) return frames_.emplace(std::move(key), std::move(info)).first->second;
    }
    ++account_.stats->unnamed_frames;
    return kUnknownFrame;
}

}  // namespace commdbg::python
