// SPDX-License-Identifier: Apache-2.0
#include "py_code_table.hpp"

namespace commdbg::python {

cd_py_code_kind py_code_kind(PyFrameKind kind, int32_t argcount) {
    switch (kind) {
    case PyFrameKind::ModuleCall:
    case PyFrameKind::RecordFunctionEnter:
    case PyFrameKind::FunctionApply:
        return CD_CODE_SELF;
    case PyFrameKind::BackwardEntry:
        return CD_CODE_BACKWARD;
    case PyFrameKind::Plain:
        break;
    }
    return argcount >= 1 ? CD_CODE_PLAIN : CD_CODE_NO_ARGS;
}

int PyCodeTable::find(uint64_t code) const {
    const uint32_t i = cd_py_code_slot(&t_, code);
    return i < CD_PY_CODE_SLOTS ? static_cast<int>(i) : -1;
}

void PyCodeTable::note(uint64_t code, cd_py_code_kind kind, uint64_t epoch) {
    // The kind goes in the low bits: an unaligned pointer stays unknown.
    if (code == 0 || (code & CD_CODE_KIND_MASK) != 0 || kind == CD_CODE_UNKNOWN) return;
    const uint64_t v = code | static_cast<uint64_t>(kind);
    int i = find(code);
    if (i < 0) {
        const uint32_t b = 2 * cd_py_code_bucket(code);
        i = t_.slot[b] == 0 ? b : t_.slot[b + 1] == 0 ? b + 1 : seen_[b] <= seen_[b + 1] ? b : b + 1;
    }
    seen_[i] = epoch;
    if (t_.slot[i] != v) t_.slot[i] = v, changed_ = true;
}

void PyCodeTable::drop(uint64_t code) {
    if (int i = find(code); i >= 0) t_.slot[i] = 0, seen_[i] = 0, changed_ = true;
}

cd_py_code_kind PyCodeTable::kind(uint64_t code) const {
    return static_cast<cd_py_code_kind>(cd_py_code_lookup(&t_, code));
}

bool PyCodeTable::take_changed() {
    const bool c = changed_;
    changed_ = false;
    return c;
}

}  // namespace commdbg::python
