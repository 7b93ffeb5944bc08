// SPDX-License-Identifier: Apache-2.0
#include "demangle.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>

namespace commdbg::host {
namespace {

// Reused across calls: __cxa_demangle reallocs it as needed, so demangling a
// whole libtorch symbol table does not malloc/free once per name.
struct DemangleBuffers {
    std::string input;  // NUL-terminated copy of the string_view
    char* out = nullptr;
    size_t out_len = 0;
    ~DemangleBuffers() { std::free(out); }
};

}  // namespace

std::string demangle(std::string_view mangled) {
    // Without the _Z prefix __cxa_demangle would read "f" as the type "float".
    if (mangled.size() < 3 || mangled.substr(0, 2) != "_Z") return std::string(mangled);
    thread_local DemangleBuffers buf;
    buf.input.assign(mangled);
    int status = 0;
    char* res = abi::__cxa_demangle(buf.input.c_str(), buf.out, &buf.out_len, &status);
    if (status != 0 || res == nullptr) return std::string(mangled);
    buf.out = res;  // may have been realloc'ed
    return std::string(res);
}

}  // namespace commdbg::host
