// SPDX-License-Identifier: Apache-2.0
// What `commdbg check --from` reads of a JSON dump (lifecycle.hpp), taken
// while the file is parsed (nlohmann's SAX interface): only the fields the
// checks use are kept, each checked for its type as it arrives, so memory
// follows the scopes and collectives kept, not the file, and a record nested
// 100000 deep costs an entry in a vector, not a frame on the call stack.
#include <istream>
#include <limits>

#include "events.h"
#include "lifecycle.hpp"
#include "py_objects.hpp"

namespace commdbg::fsdp {

namespace {

// The longest scope label commdbg writes: the kernel reads CD_LABEL_MAX - 1
// bytes, a label read from Python is kPyMaxString characters of at most 4
// UTF-8 bytes.  A longer one was not written by commdbg.
constexpr size_t kMaxLabelBytes = 4 * python::kPyMaxString;
static_assert(CD_LABEL_MAX - 1 <= kMaxLabelBytes);

// The containers whose fields the checks read; any other is skipped whole.
enum class Role : uint8_t { Top, Processes, Process, ProcessInfo, Communicators, Communicator, Fsdp, Records, Record };

bool is_array(Role r) { return r == Role::Processes || r == Role::Communicators || r == Role::Records; }

// How one record sits in the tree (its TraceItem holds the rest), in the
// order records open: a parent before its children.
struct Link {
    int32_t parent = -1;  // the enclosing record
    bool collective = false, has_bytes = false;
    bool keyed = false;  // a collective that says which ("collective"): a trace item
};

// Every record of a process while it is read, as TraceItems (most of them
// kept: scopes), compacted in place to the kept ones at its end.
struct Records {
    std::vector<TraceItem> items;
    std::vector<Link> links;
};

struct Frame {
    explicit Frame(Role r) : role(r) {}
    Role role;
    std::string key;   // in an object: the key of the value being read
    size_t index = 0;  // in an array: the element being read
    size_t next = 0;
    int32_t node = -1;  // Record: its node; Records: the record they are the children of
    std::string name, layer, collective;  // Record: read so far (the type may come last)
};

// A JSON value as the checks see its type.
struct Value {
    enum Kind : uint8_t { Null, Bool, Negative, Unsigned, Float, String, Object, Array } kind;
    uint64_t u = 0;
    int64_t i = 0;
    std::string* s = nullptr;
};

const char* described(Value::Kind k) {
    switch (k) {
    case Value::Null: return "null";
    case Value::Bool: return "a boolean";
    case Value::Negative: return "a negative number";
    case Value::Unsigned: return "an unsigned integer";
    case Value::Float: return "a number with a fraction or exponent";
    case Value::String: return "a string";
    case Value::Object: return "an object";
    case Value::Array: return "an array";
    }
    return "?";
}

uint64_t saturating_add(uint64_t a, uint64_t b) {
    return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

// The trace items of one process's records -- each scope, and each
// outermost collective that names its kind, with its enclosing scope -- in
// start order, made in place.
std::vector<TraceItem> items_of(Records& r) {
    std::vector<TraceItem>& items = r.items;
    const std::vector<Link>& links = r.links;
    // A collective without bytes of its own has those of its child
    // collectives (c10d's call: its NCCL calls).  Children follow parents.
    for (size_t i = items.size(); i-- > 0;) {
        const int32_t p = links[i].parent;
        if (links[i].collective && p >= 0 && !links[p].has_bytes)
            items[p].bytes = saturating_add(items[p].bytes, items[i].bytes);
    }
    std::vector<int32_t> scope_in(items.size());  // the scope item a record's children are in
    std::vector<bool> in_coll(items.size());      // ... and whether they are inside a collective item
    size_t kept = 0;
    for (size_t i = 0; i < items.size(); ++i) {
        const int32_t p = links[i].parent;
        int32_t scope = p >= 0 ? scope_in[p] : -1;
        bool coll = p >= 0 && in_coll[p];
        if (items[i].scope || (links[i].collective && links[i].keyed && !coll)) {
            if (items[i].scope) items[i].bytes = 0;
            items[i].parent = scope;
            if (kept != i) items[kept] = std::move(items[i]);
            if (items[kept].scope) scope = static_cast<int32_t>(kept);
            else coll = true;
            ++kept;
        }
        scope_in[i] = scope;
        in_coll[i] = coll;
    }
    items.resize(kept);
    if (items.capacity() > 2 * kept) items.shrink_to_fit();  // most were ops
    std::vector<Link>().swap(r.links);
    sort_by_start(items);
    return std::move(items);
}

// The SAX handler: a stack of the containers open, the processes being read.
class DumpReader {
public:
    explicit DumpReader(const std::function<void(DumpedProcess&&)>& each) : each_(each) {}

    bool null() { return value({Value::Null}); }
    bool boolean(bool) { return value({Value::Bool}); }
    bool number_integer(int64_t v) {
        return value({.kind = v < 0 ? Value::Negative : Value::Unsigned, .u = v < 0 ? 0 : static_cast<uint64_t>(v), .i = v});
    }
    bool number_unsigned(uint64_t v) { return value({.kind = Value::Unsigned, .u = v, .i = 0}); }
    bool number_float(double, const std::string&) { return value({Value::Float}); }
    bool string(std::string& v) { return value({.kind = Value::String, .u = 0, .i = 0, .s = &v}); }
    bool binary(nlohmann::json::binary_t&) { return value({Value::Null}); }
    bool start_object(size_t) { return value({Value::Object}); }
    bool start_array(size_t) { return value({Value::Array}); }
    bool key(std::string& k) {
        if (skip_ == 0) frames_.back().key = std::move(k);
        return true;
    }
    bool end_object() { return end(); }
    bool end_array() { return end(); }
    bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
        std::string what = e.what();
        if (auto at = what.find("] "); at != std::string::npos) what.erase(0, at + 2);
        error_ = "not valid JSON (" + what + ")";
        return false;
    }

    size_t processes() const { return processes_; }
    const std::string& error() const { return error_; }

private:
    bool value(const Value& v);
    bool in_process(Frame& f, const Value& v);
    bool in_process_info(Frame& f, const Value& v);
    bool in_record(Frame& f, const Value& v);
    bool end();
    bool end_record(Frame& f);
    void end_process();

    // Opens a container the checks read (`role`), or skips any other value.
    bool open(const Value& v, Role role, Value::Kind want) {
        if (v.kind != want) return wrong_type(described(want), v);
        frames_.emplace_back(role);
        return true;
    }
    bool skip(const Value& v) {
        if (v.kind == Value::Object || v.kind == Value::Array) skip_ = 1;
        return true;
    }
    bool wrong_type(const std::string& want, const Value& v) {
        return fail("expected " + want + ", got " + described(v.kind));
    }
    bool fail(const std::string& why) {
        error_ = "field \"" + path() + "\": " + why;
        return false;
    }
    // An unsigned integer of at most `max`, into `out`.
    template <typename T>
    bool unsigned_field(const Value& v, T& out, T max = std::numeric_limits<T>::max()) {
        if (v.kind != Value::Unsigned) return wrong_type("an unsigned integer", v);
        if (v.u > max) return fail("expected an unsigned integer of at most " + std::to_string(max) + ", got " + std::to_string(v.u));
        out = static_cast<T>(v.u);
        return true;
    }
    bool string_field(const Value& v, std::string& out) {
        if (v.kind != Value::String) return wrong_type("a string", v);
        out = std::move(*v.s);
        return true;
    }
    std::string path() const;

    const std::function<void(DumpedProcess&&)>& each_;
    std::vector<Frame> frames_;
    std::vector<DumpedProcess> open_;  // the top object's, then the one of "processes" being read
    std::vector<Records> records_;  // their records
    size_t skip_ = 0;  // the depth inside a skipped container
    bool multi_ = false;  // the top object has "processes": its own fields are not a process
    size_t processes_ = 0;
    std::string error_;
};

// "processes[0].records[3].children[1].tid"; a deep one elided in the
// middle ("records[0].children[0]...children[0].tid"), so a message stays a line.
std::string DumpReader::path() const {
    constexpr size_t kHead = 6, kTail = 8;
    const size_t n = frames_.size();
    size_t tail = n > kHead + kTail ? n - kTail : n;
    if (tail < n && is_array(frames_[tail].role)) --tail;  // the tail begins at a key
    std::string p;
    for (size_t i = 0; i < n; ++i) {
        if (i == kHead && tail < n) {
            p += "..";  // the key's own "." makes it "..."
            i = tail - 1;
            continue;
        }
        const Frame& f = frames_[i];
        if (is_array(f.role)) p += "[" + std::to_string(f.index) + "]";
        else p += (p.empty() ? "" : ".") + f.key;
    }
    return p;
}

bool DumpReader::value(const Value& v) {
    if (skip_ > 0) {
        if (v.kind == Value::Object || v.kind == Value::Array) ++skip_;
        return true;
    }
    if (frames_.empty()) {
        if (v.kind != Value::Object) {
            error_ = std::string("expected an object at the top, got ") + described(v.kind);
            return false;
        }
        frames_.emplace_back(Role::Top);
        open_.emplace_back();
        records_.emplace_back();
        return true;
    }
    Frame& f = frames_.back();
    if (is_array(f.role)) f.index = f.next++;
    switch (f.role) {
    case Role::Top:
        if (f.key == "processes") {
            multi_ = true;
            return open(v, Role::Processes, Value::Array);
        }
        return in_process(f, v);
    case Role::Process: return in_process(f, v);
    case Role::Processes:
        if (!open(v, Role::Process, Value::Object)) return false;
        open_.emplace_back();
        records_.emplace_back();
        return true;
    case Role::ProcessInfo: return in_process_info(f, v);
    case Role::Communicators: return open(v, Role::Communicator, Value::Object);
    case Role::Communicator: {
        if (f.key != "rank") return skip(v);
        if (v.kind != Value::Unsigned && v.kind != Value::Negative) return wrong_type("an integer", v);
        if (v.kind == Value::Unsigned ? v.u > INT32_MAX : v.i < INT32_MIN)
            return fail("expected a rank (a 32-bit integer), got " + (v.kind == Value::Unsigned ? std::to_string(v.u) : std::to_string(v.i)));
        const int rank = v.kind == Value::Unsigned ? static_cast<int>(v.u) : static_cast<int>(v.i);
        if (open_.back().rank < 0 && rank >= 0) open_.back().rank = rank;
        return true;
    }
    case Role::Fsdp: {
        if (f.key != "window") return skip(v);
        std::string window;
        if (!string_field(v, window)) return false;
        open_.back().from_start = window == "from_start";
        return true;
    }
    case Role::Records: {
        const int32_t parent = f.node;
        if (records_.back().items.size() >= INT32_MAX) return fail("more records in one process than 2^31 - 1");
        if (!open(v, Role::Record, Value::Object)) return false;
        Records& r = records_.back();
        r.items.emplace_back();
        r.links.emplace_back().parent = parent;
        frames_.back().node = static_cast<int32_t>(r.items.size() - 1);
        return true;
    }
    case Role::Record: return in_record(f, v);
    }
    return skip(v);
}

bool DumpReader::in_process(Frame& f, const Value& v) {
    if (f.key == "records") return open(v, Role::Records, Value::Array);
    if (f.key == "process") return open(v, Role::ProcessInfo, Value::Object);
    if (f.key == "communicators") return open(v, Role::Communicators, Value::Array);
    if (f.key == "fsdp") return open(v, Role::Fsdp, Value::Object);
    if (f.key == "dropped_records") return unsigned_field(v, open_.back().dropped_records);
    return skip(v);
}

bool DumpReader::in_process_info(Frame& f, const Value& v) {
    DumpedProcess& p = open_.back();
    if (f.key == "pid") return unsigned_field(v, p.pid);
    if (f.key != "exit_code" && f.key != "signal") return skip(v);
    // exit_code: the status of exit(N), null while running or after a signal; signal: which.
    if (v.kind == Value::Null) return true;
    if (v.kind != Value::Unsigned && v.kind != Value::Negative) return wrong_type("an integer or null", v);
    p.ended = true;
    return true;
}

bool DumpReader::in_record(Frame& f, const Value& v) {
    TraceItem& it = records_.back().items[f.node];
    Link& link = records_.back().links[f.node];
    if (f.key == "children") {
        const int32_t node = f.node;
        if (!open(v, Role::Records, Value::Array)) return false;
        frames_.back().node = node;
        return true;
    }
    if (f.key == "type") {
        std::string type;
        if (!string_field(v, type)) return false;
        it.scope = type == "scope";
        link.collective = type == "collective";
        return true;
    }
    if (f.key == "name") return string_field(v, f.name);
    if (f.key == "layer") return string_field(v, f.layer);
    if (f.key == "collective") {
        link.keyed = true;
        return string_field(v, f.collective);
    }
    if (f.key == "tid") return unsigned_field(v, it.tid);
    if (f.key == "start_ns") return unsigned_field(v, it.start_ns);
    if (f.key == "bytes") {
        link.has_bytes = true;
        return unsigned_field(v, it.bytes);
    }
    return skip(v);
}

bool DumpReader::end() {
    if (skip_ > 0) {
        --skip_;
        return true;
    }
    if (frames_.back().role == Role::Record && !end_record(frames_.back())) return false;
    const Role role = frames_.back().role;
    frames_.pop_back();
    if (role == Role::Process || (role == Role::Top && !multi_)) end_process();
    return true;
}

// A record's name, now that its type is known: a scope's label, a collective's key.
bool DumpReader::end_record(Frame& f) {
    TraceItem& it = records_.back().items[f.node];
    const Link& link = records_.back().links[f.node];
    if (it.scope) {
        if (f.name.size() > kMaxLabelBytes) {
            f.key = "name";
            return fail("a scope label of " + std::to_string(f.name.size()) + " bytes; commdbg writes at most " +
                        std::to_string(kMaxLabelBytes));
        }
        it.name = std::move(f.name);
    } else if (link.collective && link.keyed) {
        it.name = (f.layer.empty() ? std::string("?") : f.layer) + "." + f.collective;
    }
    return true;
}

void DumpReader::end_process() {
    DumpedProcess p = std::move(open_.back());
    p.items = items_of(records_.back());
    open_.pop_back();
    records_.pop_back();
    ++processes_;
    each_(std::move(p));
}

}  // namespace

Result<size_t> read_dump(std::istream& in, const std::function<void(DumpedProcess&&)>& each) {
    DumpReader reader(each);
    if (!nlohmann::json::sax_parse(in, &reader)) return Result<size_t>::fail(reader.error());
    return reader.processes();
}

}  // namespace commdbg::fsdp
