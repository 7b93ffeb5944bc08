// SPDX-License-Identifier: Apache-2.0
#include "record_function.hpp"

#include <map>
#include <vector>

#include "x86_decode.hpp"

namespace commdbg::torch {
namespace {

constexpr std::string_view kEnterNewPrefix = "_ZN5torch8autograd8profiler25record_function_enter_new";
constexpr const char* kEnd = "_ZN2at14RecordFunction3endEv";

struct TailCall {
    uint64_t target = 0;  // the jump's target (link-time)
    size_t jump = 0;      // the jump's offset in `c`
};

// Where the function at `at` of `c` tail-calls a member of the object its
// first argument points to, or nullopt.
std::optional<TailCall> member_tail_call(const std::vector<uint8_t>& c, size_t at, uint64_t base) {
    if (arch::bytes_at(c, at, {0xf3, 0x0f, 0x1e, 0xfa})) at += 4;
    if (!arch::bytes_at(c, at, {0x48, 0x8b, 0x3f})) return std::nullopt;  // mov (%rdi),%rdi
    at += 3;
    // add $imm8,%rdi | lea imm8(%rdi),%rdi
    if (!arch::bytes_at(c, at, {0x48, 0x83, 0xc7, -1}) && !arch::bytes_at(c, at, {0x48, 0x8d, 0x7f, -1}))
        return std::nullopt;
    at += 4;
    if (!arch::bytes_at(c, at, {0xe9, -1, -1, -1, -1})) return std::nullopt;  // jmp rel32
    return TailCall{base + at + 5 + arch::rel32_at(c, at + 1), at};
}

}  // namespace

std::optional<host::ElfSymbol> derive_record_function_exit(const std::string& path, std::string& why) {
    const std::string not_found = path + ": torch's record_function exit is not found: ";
    auto elf = host::read_elf_data(path, [](std::string_view n) { return n.starts_with(kEnterNewPrefix) || n == kEnd; });
    if (!elf) return why = elf.error(), std::nullopt;
    uint64_t enter = 0, end = 0;
    for (const auto& [name, at] : elf->symbols) (name == kEnd ? end : enter) = at;
    if (!enter || !end) return why = not_found + "no record_function_enter_new or RecordFunction::end()", std::nullopt;
    const uint64_t from = (enter > kRecordFunctionExitWindow ? enter - kRecordFunctionExitWindow : 0) & ~uint64_t{15};
    auto code = host::read_code_at(path, *elf, from, 2 * kRecordFunctionExitWindow);
    if (!code) return why = code.error(), std::nullopt;
    std::map<uint64_t, bool> reaches_end;  // jump target -> whether it is end() or its PLT stub
    auto is_end = [&](uint64_t t) {
        if (t == end) return true;
        auto [it, fresh] = reaches_end.emplace(t, false);
        if (!fresh) return it->second;
        return it->second = host::is_plt_stub_of(path, *elf, t, kEnd);
    };
    std::vector<uint64_t> found;  // the tail jumps
    for (size_t i = 0; i + 16 <= code->size(); i += 16)  // functions start 16-byte aligned
        if (auto t = member_tail_call(*code, i, from); t && is_end(t->target)) found.push_back(from + t->jump);
    if (found.size() != 1)
        return why = not_found + std::to_string(found.size()) + " functions near record_function_enter_new tail-call "
                     "RecordFunction::end() on a member of their argument's object (one expected)",
               std::nullopt;
    const auto offset = host::file_offset_of(*elf, found[0]);
    if (!offset) return why = not_found + "outside every segment", std::nullopt;
    return host::ElfSymbol{std::string(kRecordFunctionExit), found[0], 5, *offset};
}

}  // namespace commdbg::torch
