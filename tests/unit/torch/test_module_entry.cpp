// SPDX-License-Identifier: Apache-2.0
// The module entry, found in each build's own code: the calls of
// getTracingState() in the pybind11 dispatcher of torch._C._get_tracing_state
// (what nn.Module._call_impl calls first), in libtorch_python.  That a probe
// there fires once per module call, and for nothing else, the e2e tests show
// (OwnCost.ModuleEntriesTrapOncePerModuleCall).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "elf_symbols.hpp"
#include "fixtures.hpp"
#include "module_entry.hpp"
#include "plt_target.hpp"
#include "test_proc.hpp"
#include "x86_decode.hpp"
#include "x86_disasm.hpp"

using namespace commdbg;

namespace {

const char* kGetTracingState = "_ZN5torch3jit6tracer15getTracingStateEv";

std::string trixie_lib(const std::string& name) {
    const char* env = std::getenv("COMMDBG_TRIXIE_ROOT");
    return std::string(env ? env : "/var/cache/commdbg/trixie-root") + "/usr/lib/x86_64-linux-gnu/" + name;
}

// The torch builds here: {libtorch_python, libtorch_cpu} of 1.13 and 2.6.
std::vector<std::pair<std::string, std::string>> builds() {
    std::vector<std::pair<std::string, std::string>> out;
    const std::string host = "/usr/lib/x86_64-linux-gnu/";
    for (auto [py, cpu] : {std::pair{host + "libtorch_python.so.1.13", host + "libtorch_cpu.so.1.13"},
                           std::pair{trixie_lib("libtorch_python.so.2.6"), trixie_lib("libtorch_cpu.so.2.6")}})
        if (std::filesystem::exists(py) && std::filesystem::exists(cpu)) out.emplace_back(py, cpu);
    if (std::getenv("CI")) {
        EXPECT_EQ(out.size(), 2u) << "CI has python3-torch and the trixie root";
    }
    return out;
}

// The code at `site`, read back from the file: one `call rel32` whose
// target is a PLT stub whose GOT slot is relocated to getTracingState().
void expect_call_of_get_tracing_state(const std::string& lib, const host::ElfSymbol& site) {
    auto code = host::read_function_code(lib, site, 16);
    ASSERT_TRUE(code) << code.error();
    ASSERT_TRUE(arch::bytes_at(*code, 0, {0xe8, -1, -1, -1, -1})) << lib << ": no call at " << std::hex << site.vaddr;
    EXPECT_EQ(site.size, 5u);
    test::expect_plt_target(lib, site.vaddr + 5 + arch::rel32_at(*code, 1), kGetTracingState);
}

}  // namespace

TEST(ModuleEntry, EachBuildsBindingCallsGetTracingStateOnEveryPath) {
    const auto found = builds();
    REQUIRE_OR_SKIP(!found.empty(), "no libtorch_python (apt install python3-torch; make trixie-root)");
    for (const auto& [py, cpu] : found) {
        auto calls = torch::tracing_state_binding_calls(py);
        ASSERT_TRUE(calls) << calls.error();
        ASSERT_FALSE(calls->empty());
        for (const auto& site : *calls) {
            EXPECT_EQ(site.name, torch::kModuleEntry);
            expect_call_of_get_tracing_state(py, site);
        }
        // The sites are the spec's for libtorch_python; libtorch_cpu beside
        // it then gets none, and says nothing.
        std::string note;
        auto sites = torch::module_entry_sites(py, note);
        ASSERT_EQ(sites.size(), calls->size());
        EXPECT_EQ(sites[0].file_offset, (*calls)[0].file_offset);
        EXPECT_TRUE(torch::module_entry_sites(cpu, note).empty()) << cpu;
        EXPECT_EQ(note, "");
    }
}

// Where libtorch_python beside libtorch_cpu has no such binding (here, a
// libtorch_python that is another program), getTracingState() itself is the
// module entry, with a note that says why and what it costs.
TEST(ModuleEntry, WithoutTheBindingGetTracingStateItselfIsProbedWithANote) {
    const auto found = builds();
    REQUIRE_OR_SKIP(!found.empty(), "no libtorch_cpu (apt install python3-torch; make trixie-root)");
    test::TempDir dir;
    const std::string cpu = dir.path("libtorch_cpu.so.9"), py = dir.path("libtorch_python.so.9");
    std::filesystem::create_symlink(found[0].second, cpu);
    std::filesystem::create_symlink("/proc/self/exe", py);
    std::string note;
    auto sites = torch::module_entry_sites(cpu, note);
    ASSERT_EQ(sites.size(), 1u) << note;
    auto elf = host::read_elf_data(cpu, {kGetTracingState});
    ASSERT_TRUE(elf) << elf.error();
    EXPECT_EQ(sites[0].vaddr, elf->symbols.at(kGetTracingState));
    EXPECT_NE(note.find(py + ": torch._C._get_tracing_state: no initPythonTracerBindings"), std::string::npos) << note;
    EXPECT_NE(note.find("one more trap per op"), std::string::npos) << note;
    // libtorch_python itself then has no site, and leaves the note to libtorch_cpu.
    std::string none;
    EXPECT_TRUE(torch::module_entry_sites(py, none).empty());
    EXPECT_EQ(none, "");
    auto calls = torch::tracing_state_binding_calls(py);
    EXPECT_FALSE(calls);
}
