// SPDX-License-Identifier: Apache-2.0
// --cost: commdbg's own CPU at the end, split into setting processes up and
// handling records.  Its record count is the dump's (every call recorded is
// one record handled), without records it handles none, and its parts add
// up to no more than the whole getrusage gives.  torch's own RecordFunctions
// (one around every autograd node run, ...) cost no record.  It also says how
// often the probes fired, bystanders' calls included.  A session writes no
// flight recorder, which only commdbgd's node counter keeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>

#include "daemon_util.hpp"
#include "e2e_util.hpp"
#include "elf_symbols.hpp"
#include "procfs.hpp"
#include "remote_memory.hpp"

namespace commdbg::e2e {
namespace {

struct CostLine {
    double total = 0, setup = 0, records_s = 0, rest = 0;
    long setups = 0, records = 0;
    long batched = 0, batched_at_end = 0;  // records that came in a thread's batch; read at the window's end
};

std::optional<CostLine> cost_line(const std::string& err) {
    static const std::regex re(
        R"(commdbg: own CPU ([0-9.]+) s: ([0-9.]+) s in ([0-9]+) process set-ups \([^)]*\), ([0-9.]+) s handling )"
        R"(([0-9]+) records \([0-9.]+ us each; ([0-9]+) came in their thread's batch, ([0-9]+) of them read from )"
        R"(the thread at the window's end\), ([0-9.]+) s the rest)");
    std::smatch m;
    if (!std::regex_search(err, m, re)) return std::nullopt;
    return CostLine{std::stod(m[1]), std::stod(m[2]), std::stod(m[4]), std::stod(m[8]), std::stol(m[3]),
                    std::stol(m[5]), std::stol(m[6]), std::stol(m[7])};
}

TEST(OwnCost, CountsTheRecordsTheDumpHoldsAndItsPartsAddUp) {
    REQUIRE_BPF();
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--cost", "--json", tmp.path("out.json"), "--", testprog("nccl_workload"),
                  "--calls", "all_reduce=300,broadcast=40", "--nranks", "4", "--rank", "1"},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    auto c = cost_line(r.err);
    ASSERT_TRUE(c) << "no cost line in: " << r.err;
    auto j = read_json(tmp.path("out.json"));
    ASSERT_FALSE(j.contains("dropped_records")) << j.dump().substr(0, 500);
    EXPECT_EQ(c->records, static_cast<long>(j["records"].size()));
    EXPECT_GE(c->records, 340);
    EXPECT_GE(c->setups, 1) << "the workload was set up at least once";
    // Printed with two decimals each: the parts may round up by 0.005 apiece.
    EXPECT_LE(c->setup + c->records_s + c->rest, c->total + 0.015) << r.err;
}

TEST(OwnCost, WithoutRecordsNoneIsHandled) {
    REQUIRE_BPF();
    auto r = run({commdbg_bin(), "run", "--cost", "--counts-only", "--", testprog("nccl_workload"), "--calls",
                  "all_reduce=300", "--nranks", "4", "--rank", "1"},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    auto c = cost_line(r.err);
    ASSERT_TRUE(c) << "no cost line in: " << r.err;
    EXPECT_EQ(c->records, 0);
    EXPECT_NE(r.out.find("calls=300"), std::string::npos) << r.out;
}

TEST(OwnCost, OnlyWhenAskedFor) {
    REQUIRE_BPF();
    auto r = run({commdbg_bin(), "run", "--counts-only", "--", testprog("nccl_workload"), "--calls", "all_reduce=3",
                  "--nranks", "4", "--rank", "1"},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_FALSE(cost_line(r.err)) << r.err;
    EXPECT_EQ(r.err.find("own CPU"), std::string::npos) << r.err;
}

// The flight recorder is commdbgd's (commdbg hang asks it, docs/hang.md); a
// session's own `flight` map is read by nobody and goes with the session, so
// a session does not write it: while a session counts a workload's
// collectives on a communicator (the stub's fake one), its `counters` map
// fills and its `flight` map stays empty.
TEST(OwnCost, ASessionWritesNoFlightRecorder) {
    REQUIRE_BPF();
    for (const char* mode : {"--counts-only", "--noise-level=0"}) {
        SCOPED_TRACE(mode);
        commdbg::testproc::Background s({commdbg_bin(), "run", mode, "--", testprog("nccl_workload"), "--fake-comm",
                                         "--calls", "all_reduce=10", "--duration-ms", "4000"},
                                        nccl_env(false));
        std::map<std::string, size_t> maps;
        for (int i = 0; i < 100 && maps["counters"] == 0; ++i) {
            daemon_util::sleep_ms(50);
            maps = daemon_util::hash_map_entries(s.pid());
        }
        ASSERT_GT(maps["counters"], 0u) << "the session counted nothing";
        ASSERT_EQ(maps.count("flight"), 1u) << "no flight map among the session's maps";
        EXPECT_EQ(maps["flight"], 0u) << "the session wrote a flight recorder nobody reads";
        auto r = s.wait(60);
        EXPECT_EQ(r.status, 0) << r.err;
    }
}

// "probes fired N times (E entries, R returns, L loader changes)": the
// kernel's own count of the programs' runs (its BPF run statistics).
struct HitsLine {
    long entries = 0, returns = 0;
};

std::optional<HitsLine> hits_line(const std::string& err) {
    static const std::regex re(R"(commdbg: probes fired [0-9]+ times \(([0-9]+) entries, ([0-9]+) returns, )");
    std::smatch m;
    if (!std::regex_search(err, m, re)) return std::nullopt;
    return HitsLine{std::stol(m[1]), std::stol(m[2])};
}

// --cost also says how often the probes fired: every call of a probed
// function, by the traced job and by a bystander that maps the same file and
// is never traced (a uprobe belongs to the file, docs/safety.md).  The
// traced calls are what the exact counters counted; the bystander's are in
// the hits and in no counter.
TEST(OwnCost, ProbeHitsAreTheTracedCallsAndABystandersToo) {
    REQUIRE_BPF();
    TempDir tmp;
    const std::string go = tmp.path("go"), done = tmp.path("done");
    const long bystander_calls = 200;
    Background bystander({"/bin/sh", "-c",
                          testprog("nccl_workload") + " --calls all_reduce=" + std::to_string(bystander_calls) +
                              " --wait-file " + go + " && touch " + done},
                         nccl_env(false));
    ASSERT_FALSE(bystander.wait_for_line("ready pid=").empty()) << "the bystander did not load the stub";
    // The traced command starts its workload (the stub is probed once it
    // maps it), lets the bystander go and waits for both; its workload calls
    // once the bystander is done.
    const std::string ready = tmp.path("ready");
    const std::string script = testprog("nccl_workload") + " --calls all_reduce=300,broadcast=40 --group --wait-file " +
                               done + " > " + ready + " & while ! grep -q ready " + ready +
                               "; do sleep 0.05; done; touch " + go + "; wait";
    auto r = run({commdbg_bin(), "run", "--cost", "--probes", "nccl", "--json", tmp.path("out.json"), "--", "/bin/sh",
                  "-c", script},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    ASSERT_EQ(bystander.wait(30).status, 0);
    auto h = hits_line(r.err);
    ASSERT_TRUE(h) << "no probe hits line in: " << r.err;
    long counted = 0;
    for (const auto& p : processes_of(read_json(tmp.path("out.json"))))
        for (const auto& k : p.value("counters", nlohmann::json::array())) counted += k.value("calls", 0L);
    EXPECT_EQ(counted, 300 + 40 + 2) << "the traced calls (and the group's start and end), none of the bystander's";
    EXPECT_EQ(h->entries, counted + bystander_calls) << r.err;
    EXPECT_EQ(h->returns, h->entries) << "every NCCL probe is return-probed";
}

// `n` bytes of `pid`'s memory where it maps byte `file_offset` of `lib`;
// empty when it maps none there.
std::vector<uint8_t> mapped_code(int pid, const std::string& lib, uint64_t file_offset, size_t n) {
    auto maps = host::read_maps(pid);
    if (!maps) return {};
    for (const auto& m : *maps) {
        if (m.path != lib || file_offset < m.offset || file_offset + n > m.offset + (m.end - m.start)) continue;
        std::vector<uint8_t> out(n);
        if (host::ProcessMemory(pid).read(m.start + (file_offset - m.offset), out.data(), n)) return out;
    }
    return {};
}

bool has_int3(const std::vector<uint8_t>& code) {
    return std::find(code.begin(), code.end(), uint8_t{0xcc}) != code.end();
}

// attach --no-follow traces one process and none of its children, so its
// probes are installed in that process alone (the kernel's per-process
// uprobe filter): a bystander mapping the same libnccl file neither runs the
// programs (no hit, where OwnCost.ProbeHitsAreTheTracedCallsAndABystandersToo
// counts its calls without --no-follow) nor carries a breakpoint in its code,
// where the traced process does; and the traced process's calls, made from
// threads other than the one its pid names, are all counted.  On a kernel
// whose filter matches one thread only, commdbg says so and probes as
// without --no-follow.
TEST(OwnCost, NoFollowProbesTheTracedProcessAlone) {
    REQUIRE_BPF();
    TempDir tmp;
    const std::string go = tmp.path("go");
    const long bystander_calls = 200;
    Background bystander({testprog("nccl_workload"), "--calls", "all_reduce=" + std::to_string(bystander_calls),
                          "--wait-file", go},
                         nccl_env(false));
    ASSERT_FALSE(bystander.wait_for_line("ready pid=").empty()) << "the bystander did not load the stub";
    Background target({testprog("nccl_workload"), "--calls", "all_reduce=300,broadcast=40", "--threads", "2",
                       "--wait-file", go},
                      nccl_env(false));
    ASSERT_FALSE(target.wait_for_line("ready pid=").empty()) << "the target did not load the stub";
    Background dbg({commdbg_bin(), "attach", std::to_string(target.pid()), "--no-daemon", "--no-follow", "--cost",
                    "--probes", "nccl", "--json", tmp.path("out.json")});
    ASSERT_FALSE(dbg.wait_for_err_line("commdbg: tracing", 60).empty()) << dbg.wait(5).err;

    // The stub's ncclAllReduce as the file has it, and in each process.
    std::string lib;
    auto target_maps = host::read_maps(target.pid());
    ASSERT_TRUE(target_maps) << target_maps.error();
    for (const auto& m : *target_maps)
        if (m.path.find("libnccl") != std::string::npos) lib = m.path;
    ASSERT_FALSE(lib.empty()) << "the target maps no libnccl";
    auto elf = host::ElfSymbols::open(lib);
    ASSERT_TRUE(elf) << elf.error();
    const host::ElfSymbol* sym = elf->find("ncclAllReduce");
    ASSERT_NE(sym, nullptr);
    auto code = host::read_function_code(lib, *sym, 16);
    ASSERT_TRUE(code) << code.error();
    const std::vector<uint8_t> in_file = *code;
    ASSERT_FALSE(has_int3(in_file)) << "an int3 in the file itself";
    const auto in_target = mapped_code(target.pid(), lib, sym->file_offset, in_file.size());
    const auto in_bystander = mapped_code(bystander.pid(), lib, sym->file_offset, in_file.size());
    EXPECT_TRUE(has_int3(in_target)) << "no breakpoint in the traced process: is it probed?";

    touch(go);
    ASSERT_EQ(bystander.wait(30).status, 0);
    auto r = dbg.wait(60);
    ASSERT_EQ(r.status, 0) << r.err;
    auto h = hits_line(r.err);
    ASSERT_TRUE(h) << "no probe hits line in: " << r.err;
    long counted = 0;
    for (const auto& k : read_json(tmp.path("out.json")).value("counters", nlohmann::json::array()))
        counted += k.value("calls", 0L);
    EXPECT_EQ(counted, 300 + 40) << r.err;
    if (r.err.find("as without --no-follow") != std::string::npos) {  // this kernel's filter is per thread
        EXPECT_NE(in_bystander, in_file) << r.err;
        EXPECT_EQ(h->entries, counted + bystander_calls) << r.err;
        return;
    }
    EXPECT_EQ(in_bystander, in_file) << "the bystander's code carries the traced process's breakpoint";
    EXPECT_EQ(h->entries, counted) << "the bystander's " << bystander_calls << " calls ran the programs: " << r.err;
}

// Without --cost the kernel's run statistics stay as they were.
TEST(OwnCost, ProbeHitsOnlyWhenAskedFor) {
    REQUIRE_BPF();
    auto r = run({commdbg_bin(), "run", "--counts-only", "--", testprog("nccl_workload"), "--calls", "all_reduce=3"},
                 nccl_env(false));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_FALSE(hits_line(r.err)) << r.err;
}

// A record_function scope is two records (its begin and its end; torch 1.13
// sends no label of its own), however many autograd nodes run inside it:
// torch builds a RecordFunction around each, and its constructor and end()
// are the very symbols torch-scopes probes.  The kernel sends neither.
TEST(OwnCost, TorchsOwnRecordFunctionsCostNoRecord) {
    REQUIRE_BPF();
    REQUIRE_TORCH(py);
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--noise-level", "2", "--probes", "torch-scopes", "--cost", "--json",
                  tmp.path("out.json"), "--", py, std::string(SOURCE_DIR) + "/tests/testprogs/scopes_and_nodes.py", "3",
                  "20"},
                 {}, 240);
    ASSERT_EQ(r.status, 0) << r.err;
    auto lines = workload_lines(r.out, "scopes");
    ASSERT_EQ(lines.size(), 1u) << r.out;
    ASSERT_GE(lines[0]["nodes_per_pass"].get<int>(), 3) << "backward runs nodes, each in a RecordFunction";
    auto c = cost_line(r.err);
    ASSERT_TRUE(c) << r.err;
    auto j = read_json(tmp.path("out.json"));
    int scopes = 0;
    for (const auto& p : processes_of(j))
        for (const auto& rec : p.value("records", nlohmann::json::array()))
            if (rec.value("type", "") == "scope") {
                ++scopes;
                EXPECT_EQ(rec.value("name", ""), "outer") << rec.dump();
            }
    EXPECT_EQ(scopes, lines[0]["scopes"].get<int>());
    EXPECT_EQ(c->records, 2L * scopes) << "one begin and one end per scope, nothing for the "
                                       << 3 * 20 * lines[0]["nodes_per_pass"].get<int>() << " nodes run inside";
}

// torch 2.6's own Python opens a scope with record_function_enter_new and
// exits it through record_function_exit_new (found in torch's code, no
// symbol names it): at::RecordFunction is not probed at all, so the
// RecordFunctions torch builds around every autograd node cost not even a
// trap.  The kernel's per-symbol counts are the traps taken: one label and
// one exit per scope, nothing else; and each scope is still one record,
// closed by its own exit.
TEST(OwnCost, Torch26ScopesTrapOnlyAtTheirOwnEnterAndExit) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--noise-level", "2", "--probes", "torch-scopes", "--cost", "--json",
                  tmp.path("out.json"), "--", kRunScript, "--bind", kTestprogs + ":" + kInRoot, trixie_root(), "python3",
                  kInRoot + "/scopes_and_nodes.py", "3", "20"},
                 kRootJobEnv, 240);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    auto lines = workload_lines(r.out, "scopes");
    ASSERT_EQ(lines.size(), 1u) << r.out;
    ASSERT_GE(lines[0]["nodes_per_pass"].get<int>(), 3) << "backward runs nodes, each in a RecordFunction";
    const long want = lines[0]["scopes"].get<long>();
    std::map<std::string, long> traps;
    int scopes = 0;
    for (const auto& p : processes_of(read_json(tmp.path("out.json")))) {
        for (const auto& k : p.value("counters", nlohmann::json::array()))
            traps[k.value("name", "")] += k.value("calls", 0L);
        for (const auto& rec : p.value("records", nlohmann::json::array()))
            if (rec.value("type", "") == "scope") {
                ++scopes;
                EXPECT_EQ(rec.value("name", ""), "outer") << rec.dump();
                EXPECT_FALSE(rec.value("end_inferred", false)) << "closed by its own exit: " << rec.dump();
            }
    }
    EXPECT_EQ(scopes, want);
    EXPECT_EQ(traps["torch::autograd::profiler::record_function_enter_new"], want);
    EXPECT_EQ(traps["record_function exit"], want);
    traps.erase("torch::autograd::profiler::record_function_enter_new");
    traps.erase("record_function exit");
    for (const auto& [name, calls] : traps) EXPECT_EQ(calls, 0) << name << " trapped";
    auto c = cost_line(r.err);
    ASSERT_TRUE(c) << r.err;
    EXPECT_EQ(c->records, 2L * scopes) << "a label and an exit per scope, nothing for the "
                                       << 3 * 20 * lines[0]["nodes_per_pass"].get<int>() << " nodes run inside";
}

// torch-modules probes the call of getTracingState() inside the dispatcher
// of torch._C._get_tracing_state, which nn.Module._call_impl calls first:
// not getTracingState() itself, which torch 2.6's Python bindings also call
// at every op they dispatch (~15 per module call on the tensor-parallel job;
// a probe there trapped at each).  The kernel's count of module-entry events
// per rank, over the whole run, is the rank's own count of its calls of that
// binding (a wrapper on torch._C), and no fewer than its module calls (a
// global forward pre-hook; a few other Python functions call the binding
// too, such as Tensor.__len__).
TEST(OwnCost, ModuleEntriesTrapOncePerModuleCall) {
    REQUIRE_BPF();
    REQUIRE_TRIXIE_ROOT(trixie_root());
    TempDir tmp;
    auto r = run({commdbg_bin(), "run", "--noise-level", "2", "--probes", "torch-modules,torch-c10d", "--json",
                  tmp.path("out.json"), "--", kRunScript, "--bind", kTestprogs + ":" + kInRoot, trixie_root(),
                  "python3", kInRoot + "/tp_commdebug.py", "--timed", "20", "--count-module-calls"},
                 kRootJobEnv, 300);
    ASSERT_EQ(r.status, 0) << r.err.substr(0, 4000);
    EXPECT_EQ(r.err.find("getTracingState() instead"), std::string::npos) << "the dispatcher was found:\n" << r.err;
    EXPECT_EQ(r.err.find("nothing probed"), std::string::npos) << "libtorch_cpu has no site, silently:\n" << r.err;
    std::map<long, nlohmann::json> calls;  // pid -> what the rank counted
    for (const auto& l : workload_lines(r.out, "module_calls")) calls[l["pid"].get<long>()] = l;
    ASSERT_EQ(calls.size(), 2u) << r.out;
    size_t ranks = 0;
    for (const auto& p : processes_of(read_json(tmp.path("out.json")))) {
        auto it = calls.find(p["process"].value("pid", 0L));
        if (it == calls.end()) continue;
        ++ranks;
        long entries = 0;
        for (const auto& k : p.value("counters", nlohmann::json::array()))
            if (k.value("name", "") == "torch._C._get_tracing_state") entries += k.value("calls", 0L);
        const long modules = it->second["module_calls"], bindings = it->second["tracing_state_calls"];
        EXPECT_GT(modules, 20 * 10) << "20 steps of a model of blocks";
        EXPECT_EQ(entries, bindings) << "one trap per call of the binding, none for the ops";
        EXPECT_GE(bindings, modules);
        EXPECT_LT(bindings, modules + modules / 20) << "the binding's other callers are rare";
    }
    EXPECT_EQ(ranks, 2u);
}

}  // namespace
}  // namespace commdbg::e2e
