// SPDX-License-Identifier: Apache-2.0
#include "record_facts.hpp"

#include "nccl.hpp"

namespace commdbg::model {

std::string dtype_name(uint32_t dtype) {
    if (auto n = capture::nccl_datatype_name(dtype)) return std::string(*n);
    return "dtype(" + std::to_string(dtype) + ")";
}

std::optional<uint64_t> record_bytes(const Record& r) {
    if (!r.has(kHasCount) || !r.has(kHasDtype)) return std::nullopt;
    auto size = capture::nccl_datatype_size(r.dtype);
    if (!size) return std::nullopt;
    return r.count * *size;
}

std::optional<Elements> record_elements(const Record& r, int32_t nranks) {
    if (!r.has(kHasCount)) return std::nullopt;
    auto n = static_cast<uint64_t>(nranks);
    switch (r.coll) {
    case CD_COLL_ALL_GATHER:
        if (nranks <= 0) return std::nullopt;
        return Elements{r.count, r.count * n};
    case CD_COLL_REDUCE_SCATTER:
        if (nranks <= 0) return std::nullopt;
        return Elements{r.count * n, r.count};
    default: return Elements{r.count, r.count};
    }
}

std::string_view record_name(const Record& r, const capture::SymbolTable& syms) {
    const capture::SymbolInfo* s = syms.find(r.sym);
    return s ? std::string_view(s->name) : std::string_view("?");
}

std::string_view record_layer(const Record& r, const capture::SymbolTable& syms) {
    const capture::SymbolInfo* s = syms.find(r.sym);
    return s ? std::string_view(s->layer) : std::string_view("?");
}

cd_role record_role(const Record& r, const capture::SymbolTable& syms) {
    const capture::SymbolInfo* s = syms.find(r.sym);
    return s ? s->role : CD_ROLE_OTHER;
}

bool is_init_all(const Record& r, const capture::SymbolTable& syms) {
    const capture::SymbolInfo* s = syms.find(r.sym);
    return s && s->role == CD_ROLE_COMM_INIT &&
           (s->tail == CD_TAIL_COMM_LIST || s->name == "ncclCommInitAll");
}

}  // namespace commdbg::model
