// SPDX-License-Identifier: Apache-2.0
// Probe specs: every built-in parses; malformed specs say file, field and
// problem; glob_match; display names (ATen struct -> aten::op.overload, checked
// against every operator of the installed ATen headers when they exist); the
// torch specs resolved against the real libtorch_cpu when it is installed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bounded_time.hpp"
#include "builtin_spec.hpp"
#include "demangle.hpp"
#include "nccl.hpp"
#include "probe_attach.hpp"
#include "probe_spec.hpp"
#include "symbol_table.hpp"

namespace fs = std::filesystem;

namespace commdbg::capture {
namespace {

// ---- built-ins ---------------------------------------------------------------

TEST(ProbeSpec, EveryBuiltinSpecFileParses) {
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(fs::path(SOURCE_DIR) / "specs"))
        if (e.path().extension() == ".json") files.insert(e.path().stem().string());
    ASSERT_FALSE(files.empty());
    // builtin_specs() silently drops a broken one; parse each file here to name it.
    for (const auto& f : files) {
        std::ifstream in(fs::path(SOURCE_DIR) / "specs" / (f + ".json"));
        std::stringstream ss;
        ss << in.rdbuf();
        auto r = parse_probe_spec(ss.str(), f + ".json");
        EXPECT_TRUE(r.ok()) << r.error();
        if (r) {
            EXPECT_EQ(r->name, f) << "spec name and file name differ";
        }
    }
    const auto& specs = builtin_specs();
    EXPECT_EQ(specs.size(), files.size()) << "a specs/*.json is missing from the binary or does not parse "
                                             "(re-run cmake configure after adding one)";
    std::set<std::string> names;
    for (const auto& s : specs) names.insert(s.name);
    EXPECT_EQ(names, files);
}

TEST(ProbeSpec, TorchSpecsNeverUseReturnProbes) {
    // The uretprobe hazard: an exception unwinding through a return probe aborts the process.
    for (const auto& s : builtin_specs()) {
        if (s.layer != "aten" && s.layer != "c10d") continue;
        EXPECT_FALSE(s.return_probes) << s.name;
        for (const auto& r : s.symbols) EXPECT_FALSE(r.info.return_probe) << s.name;
    }
}

TEST(ProbeSpec, SelectByNameAndUnknownName) {
    std::vector<std::string> errors;
    auto specs = select_specs({"nccl", "torch-c10d", "torch-aten"}, errors);
    EXPECT_TRUE(errors.empty()) << errors.front();
    ASSERT_EQ(specs.size(), 3u);
    EXPECT_EQ(specs[1].layer, "c10d");
    EXPECT_EQ(specs[2].layer, "aten");
    specs = select_specs({"no-such-spec"}, errors);
    EXPECT_TRUE(specs.empty());
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_NE(errors[0].find("no-such-spec"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("torch-aten"), std::string::npos) << "lists the built-ins: " << errors[0];
}

TEST(ProbeSpec, UnknownNameIsEchoedInPartOnly) {
    // Names come from the command line or a daemon request: a reply stays small.
    std::vector<std::string> errors;
    auto specs = select_specs({std::string(65000, 'x')}, errors);
    EXPECT_TRUE(specs.empty());
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_NE(errors[0].find("probe spec \"xxxx"), std::string::npos) << errors[0].substr(0, 300);
    EXPECT_NE(errors[0].find("no built-in spec of that name"), std::string::npos) << errors[0].substr(0, 300);
    EXPECT_LT(errors[0].size(), 400u);
}

// ---- malformed specs ---------------------------------------------------------

std::string spec_error(const std::string& text) {
    auto r = parse_probe_spec(text, "bad.json");
    EXPECT_FALSE(r.ok()) << "accepted: " << text;
    return r.ok() ? std::string{} : r.error();
}

void expect_has(const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "\"" << p << "\" not in: " << msg;
}

const char* kRule = R"({"match": "f", "role": "op"})";

std::string spec_with(const std::string& top, const std::string& rule = kRule) {
    return "{" + top + R"("layer": "x", "library": ["libx.so*"], "symbols": [)" + rule + "]}";
}

TEST(ProbeSpecErrors, NotJson) { expect_has(spec_error("{ not json"), {"bad.json", "not valid JSON"}); }

TEST(ProbeSpecErrors, NotAnObject) { expect_has(spec_error("[1, 2]"), {"bad.json", "object"}); }

TEST(ProbeSpecErrors, MissingName) { expect_has(spec_error(spec_with("")), {"bad.json", "\"name\"", "missing"}); }

TEST(ProbeSpecErrors, NameNotAString) {
    expect_has(spec_error(spec_with(R"("name": 3,)")), {"bad.json", "\"name\"", "must be a string"});
}

TEST(ProbeSpecErrors, MissingLibrary) {
    expect_has(spec_error(R"({"name": "a", "layer": "x", "symbols": [{"match": "f", "role": "op"}]})"),
               {"bad.json", "\"library\"", "missing"});
}

TEST(ProbeSpecErrors, BadRole) {
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "kernel"})")),
               {"bad.json", "symbols[0]", "\"role\"", "unknown role \"kernel\"", "collective"});
}

TEST(ProbeSpecErrors, MissingRole) {
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f"})")),
               {"bad.json", "symbols[0]", "\"role\"", "missing"});
}

TEST(ProbeSpecErrors, CollectiveWithoutKindAndUnknownKind) {
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "collective"})")),
               {"bad.json", "symbols[0]", "\"collective\""});
    expect_has(spec_error(spec_with(R"("name": "a",)",
                                    R"({"match": "f", "role": "collective", "collective": "allreduce"})")),
               {"bad.json", "\"collective\"", "unknown kind \"allreduce\"", "all_reduce"});
}

TEST(ProbeSpecErrors, BadRegex) {
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"regex": "^at::(unclosed", "role": "op"})")),
               {"bad.json", "symbols[0]", "\"regex\"", "invalid regular expression"});
}

TEST(ProbeSpecErrors, OverLongRegexIsRefusedWithABoundedMessage) {
    const std::string rule = R"({"regex": ")" + std::string(500000, 'a') + R"(", "role": "op"})";
    std::string e = spec_error(spec_with(R"("name": "a",)", rule));
    expect_has(e, {"bad.json", "symbols[0]", "\"regex\"", "500000 bytes, over the"});
    EXPECT_NE(e.find(std::to_string(kMaxPatternBytes) + "-byte limit"), std::string::npos) << e.substr(0, 300);
    EXPECT_LT(e.size(), 400u);
}

TEST(ProbeSpecErrors, OverLongGlobIsRefused) {
    const std::string rule = R"({"glob": ")" + std::string(kMaxPatternBytes + 1, '*') + R"(", "role": "op"})";
    expect_has(spec_error(spec_with(R"("name": "a",)", rule)), {"bad.json", "symbols[0]", "\"glob\"", "-byte limit"});
}

TEST(ProbeSpecErrors, RegexCompilingTooLargeIsRefused) {
    std::string re;
    for (int i = 0; i < 100; ++i) re += "[a-z]{1000}";
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"regex": ")" + re + R"(", "role": "op"})")),
               {"bad.json", "symbols[0]", "\"regex\"", "KiB", "simplify it"});
}

// The regex runs over every demangled name of a library before tracing
// starts: a pattern that backtracks exponentially kept attach busy for
// minutes.  Planned on this test binary, whose symbols include capture::glob_match.
TEST(ProbeSpecRegex, PathologicalRegexIsPlannedInBoundedTimeAndPicksTheRightSymbols) {
    std::string re = "^";
    for (int i = 0; i < 12; ++i) re += "(.*?)*";
    re += "commdbg::capture::glob_match\\\\(";
    auto spec = parse_probe_spec(spec_with(R"("name": "a",)", R"({"regex": ")" + re + R"(", "role": "op"})"), "p.json");
    ASSERT_TRUE(spec) << spec.error();
    auto names = timing::finishes_within(timing::kPatternTimeBound, [spec = spec.value()] {
        SymbolTable syms;
        std::set<std::string> out;
        auto plan = ProbeAttacher::plan(spec, "/proc/self/exe", syms);
        if (!plan) return std::set<std::string>{"plan failed: " + plan.error()};
        for (auto c : plan->cookies) out.insert(syms.from_cookie(c)->name);
        return out;
    });
    ASSERT_TRUE(names) << "no plan within " << timing::kPatternTimeBound.count() << " s";
    EXPECT_EQ(*names, std::set<std::string>{"commdbg::capture::glob_match"});
}

// "if_file" / "unless_file": a relative path (or several) and a text.
TEST(ProbeSpecErrors, FileConditionsNeedRelativePathsAndAText) {
    const std::string cond = R"({"path": "../x.py", "contains": "t"})";
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "op", "if_file": )" + cond +
                                                           R"(, "unless_file": )" + cond + "}")),
               {"symbols[0]", "at most one", "if_file", "unless_file"});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "op", "if_file": "../x.py"})")),
               {"symbols[0]", "\"if_file\" must be an object"});
    expect_has(spec_error(spec_with(R"("name": "a",)",
                                    R"({"match": "f", "role": "op", "unless_file": {"path": ["../x", "/etc/x"], "contains": "t"}})")),
               {"symbols[0]", "\"/etc/x\"", "relative to the library's directory"});
    expect_has(spec_error(spec_with(R"("name": "a",)",
                                    R"({"match": "f", "role": "op", "if_file": {"path": "../x", "contains": ""}})")),
               {"symbols[0]", "contains", "must not be empty"});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "op", "if_file": {"contains": "t"}})")),
               {"symbols[0]", "path"});
}

// A rule with a file condition applies where a file beside the library holds
// the text (one of its paths), one with "unless_file" elsewhere: planned on
// this test binary, reached through a link in a directory whose sibling
// holds the file.  A FIFO in its place holds nothing, and does not block.
TEST(ProbeSpecCondition, ARuleAppliesWhereAFileBesideTheLibrarySays) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("commdbg-cond-" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "lib");
    fs::create_directories(dir / "py");
    fs::create_symlink(fs::canonical("/proc/self/exe"), dir / "lib" / "libx.so");
    auto spec = parse_probe_spec(
        spec_with(R"("name": "a",)", R"({"glob": "commdbg::capture::glob_match(*", "role": "op",
                      "if_file": {"path": ["../none/x.py", "../py/x.py"], "contains": "new_way"}},
                     {"glob": "commdbg::capture::parse_probe_spec(*", "role": "op",
                      "unless_file": {"path": ["../none/x.py", "../py/x.py"], "contains": "new_way"}})"),
        "p.json");
    ASSERT_TRUE(spec) << spec.error();
    // By value: finishes_within may leave it running.
    auto probed = [spec = spec.value(), lib = (dir / "lib" / "libx.so").string()] {
        SymbolTable syms;
        std::set<std::string> out;
        auto plan = ProbeAttacher::plan(spec, lib, syms);
        EXPECT_TRUE(plan.ok()) << plan.error();
        if (plan.ok())
            for (auto c : plan->cookies) out.insert(syms.from_cookie(c)->name);
        return out;
    };
    const std::set<std::string> when_holds{"commdbg::capture::glob_match"};
    const std::set<std::string> otherwise{"commdbg::capture::parse_probe_spec"};
    EXPECT_EQ(probed(), otherwise);  // no such file
    std::ofstream(dir / "py" / "x.py") << "def f():\n    the_old_way()\n";
    EXPECT_EQ(probed(), otherwise);
    std::ofstream(dir / "py" / "x.py") << "def f():\n    the.new_way()\n";
    EXPECT_EQ(probed(), when_holds);
    fs::remove(dir / "py" / "x.py");
    ASSERT_EQ(mkfifo((dir / "py" / "x.py").c_str(), 0600), 0);
    auto names = timing::finishes_within(timing::kPatternTimeBound, probed);
    ASSERT_TRUE(names) << "a FIFO held the plan";
    EXPECT_EQ(*names, otherwise);
    fs::remove_all(dir);
}

// A c10d note reads `this` and a store (and a store's prefix) in the kernel:
// a rule without them is refused, naming what it lacks.
TEST(ProbeSpecErrors, C10dTailsNeedTheirArguments) {
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "op", "tail": "c10d_store",
        "args": {"object": 0, "name": 1, "store": 2}})")),
               {"bad.json", "symbols[0]", "c10d tail", "comm_init"});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "comm_init", "tail": "c10d_store",
        "args": {"object": 0, "store": 2}})")),
               {"symbols[0]", "\"name\""});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "comm_init", "tail": "c10d_group",
        "args": {"object": 0, "store": 1}})")),
               {"symbols[0]", "\"rank\"", "\"nranks\""});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "comm_init", "tail": "c10d_group",
        "args": {"store": 1, "rank": 2, "nranks": 3}})")),
               {"symbols[0]", "\"object\""});
    EXPECT_TRUE(parse_probe_spec(spec_with(R"("name": "a",)", R"({"match": "f", "role": "comm_init",
        "tail": "c10d_group", "args": {"object": 0, "store": 1, "rank": 2, "nranks": 3}})"), "ok.json").ok());
}

// What commdbgd watches new mappings for: each library glob up to its
// wildcard, one prefix for a library and its versions.
TEST(ProbeSpec, FilePrefixesAreTheLibrariesBeginnings) {
    std::vector<std::string> errors;
    EXPECT_EQ(file_prefixes_of(select_specs({"nccl"}, errors)), (std::vector<std::string>{"libnccl.so"}));
    EXPECT_EQ(file_prefixes_of(select_specs({"nccl", "torch-c10d", "torch-aten"}, errors)),
              (std::vector<std::string>{"libnccl.so", "libtorch_cpu.so", "libtorch_cuda.so"}));
    EXPECT_TRUE(errors.empty());
}

TEST(ProbeSpecErrors, ArgIndexOutOfRange) {
    std::string rule = R"({"match": "f", "role": "op", "args": {"count": )" + std::to_string(CD_NUM_ARGS) + "}}";
    expect_has(spec_error(spec_with(R"("name": "a",)", rule)),
               {"bad.json", "symbols[0]", "args.count", "argument index"});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "op", "args": {"count": -1}})")),
               {"bad.json", "args.count", "argument index"});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "op", "args": {"bogus": 1}})")),
               {"bad.json", "\"args\"", "unknown argument \"bogus\""});
}

TEST(ProbeSpecErrors, SymbolsNotAnArray) {
    expect_has(spec_error(R"({"name": "a", "layer": "x", "library": "libx.so", "symbols": {"match": "f"}})"),
               {"bad.json", "\"symbols\"", "list"});
    expect_has(spec_error(R"({"name": "a", "layer": "x", "library": "libx.so", "symbols": []})"),
               {"bad.json", "\"symbols\"", "non-empty"});
}

TEST(ProbeSpecErrors, NotExactlyOneSelector) {
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "glob": "g*", "role": "op"})")),
               {"bad.json", "symbols[0]", "exactly one of"});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"role": "op"})")), {"bad.json", "exactly one of"});
}

TEST(ProbeSpecErrors, SecondRuleIsNamed) {
    expect_has(spec_error(spec_with(R"("name": "a",)", std::string(kRule) + R"(, {"match": "g", "role": "nope"})")),
               {"bad.json", "symbols[1]", "unknown role"});
}

TEST(ProbeSpecErrors, BadReturnProbesAndNameFrom) {
    expect_has(spec_error(spec_with(R"("name": "a", "return_probes": "yes",)")),
               {"bad.json", "\"return_probes\"", "true or false"});
    expect_has(spec_error(spec_with(R"("name": "a",)", R"({"match": "f", "role": "op", "name_from": "x"})")),
               {"bad.json", "\"name_from\"", "unknown \"x\""});
}

TEST(ProbeSpecErrors, LibraryListWithNonString) {
    expect_has(spec_error(R"({"name": "a", "layer": "x", "library": ["a", 1], "symbols": [{"match": "f", "role": "op"}]})"),
               {"bad.json", "\"library\"", "strings"});
}

TEST(ProbeSpecErrors, SelectSpecsNamesTheFile) {
    fs::path p = fs::temp_directory_path() / ("commdbg-bad-spec-" + std::to_string(::getpid()) + ".json");
    {
        std::ofstream out(p);
        out << spec_with(R"("name": "a",)", R"({"match": "f", "role": "kernel"})");
    }
    std::vector<std::string> errors;
    auto specs = select_specs({p.string()}, errors);
    fs::remove(p);
    EXPECT_TRUE(specs.empty());
    ASSERT_EQ(errors.size(), 1u);
    expect_has(errors[0], {p.string().c_str(), "\"role\"", "kernel"});
    errors.clear();
    select_specs({"/no/such/spec.json"}, errors);
    ASSERT_EQ(errors.size(), 1u);
    expect_has(errors[0], {"/no/such/spec.json", "cannot read"});
}

// ---- glob_match ----------------------------------------------------------------

TEST(GlobMatch, Basics) {
    EXPECT_TRUE(glob_match("libnccl.so.*", "libnccl.so.2"));
    EXPECT_TRUE(glob_match("libnccl.so*", "libnccl.so"));
    EXPECT_FALSE(glob_match("libnccl.so.*", "libnccl.so"));
    EXPECT_TRUE(glob_match("libtorch_cpu.so.*", "libtorch_cpu.so.1.13.0"));
    EXPECT_FALSE(glob_match("libtorch_cpu.so.*", "libtorch_cuda.so.1.13.0"));
    EXPECT_TRUE(glob_match("*", ""));
    EXPECT_TRUE(glob_match("", ""));
    EXPECT_FALSE(glob_match("", "a"));
    EXPECT_TRUE(glob_match("a?c", "abc"));
    EXPECT_FALSE(glob_match("a?c", "ac"));
    EXPECT_TRUE(glob_match("*a*b*c*", "xxaxxbxxcxx"));
    EXPECT_FALSE(glob_match("*a*b*c*", "xxaxxcxxbxx"));
    EXPECT_TRUE(glob_match("a**b", "ab"));
    EXPECT_TRUE(glob_match("*.so.*", "lib.so.so.1"));
}

TEST(GlobMatch, C10dRulesDoNotOverlap) {
    const char* ar = "c10d::ProcessGroupGloo::allreduce(*";
    EXPECT_TRUE(glob_match(ar, "c10d::ProcessGroupGloo::allreduce(std::vector<at::Tensor, std::allocator<at::Tensor> >&, "
                               "c10d::AllreduceOptions const&)"));
    EXPECT_FALSE(glob_match(ar, "c10d::ProcessGroupGloo::allreduce_coalesced(std::vector<at::Tensor>&, "
                                "c10d::AllreduceCoalescedOptions const&)"));
    EXPECT_FALSE(glob_match("c10d::ProcessGroup::allreduce(*", "c10d::ProcessGroupGloo::allreduce(x)"));
    EXPECT_FALSE(glob_match("c10d::ProcessGroupGloo::reduce(*", "c10d::ProcessGroupGloo::reduce_scatter(x)"));
    EXPECT_FALSE(glob_match("c10d::ProcessGroupGloo::allgather(*", "c10d::ProcessGroupGloo::allgather_coalesced(x)"));
}

// ---- derive_name -----------------------------------------------------------------

SymbolRule aten_rule() {
    SymbolRule r;
    r.name_from = NameFrom::AtenOp;
    return r;
}

std::string aten(const std::string& st) {
    return derive_name(aten_rule(), "_ZN2at4_ops" + st, "at::_ops::" + st + "::call(at::Tensor const&)");
}

TEST(DeriveName, AtenCasesFromTheBrief) {
    EXPECT_EQ(aten("add_Tensor"), "aten::add.Tensor");
    EXPECT_EQ(aten("addmm"), "aten::addmm");
    EXPECT_EQ(aten("linear"), "aten::linear");
    EXPECT_EQ(aten("add_out"), "aten::add.out");
    EXPECT_EQ(aten("_to_copy"), "aten::_to_copy");
    EXPECT_EQ(aten("sum_dim_IntList"), "aten::sum.dim_IntList");
    EXPECT_EQ(aten("mm"), "aten::mm");
}

// Real at::_ops structs of libtorch_cpu 1.13 (nm -DC), with name/overload_name
// from their ATen/ops/*_ops.h.
TEST(DeriveName, AtenRealNames) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"add__Tensor", "aten::add_.Tensor"},
        {"relu_", "aten::relu_"},
        {"__and___Tensor", "aten::__and__.Tensor"},
        {"__iand___Scalar", "aten::__iand__.Scalar"},
        {"_foreach_add_Scalar_out", "aten::_foreach_add.Scalar_out"},
        {"_foreach_add__ScalarList", "aten::_foreach_add_.ScalarList"},
        {"max_pool2d_with_indices_out", "aten::max_pool2d_with_indices.out"},
        {"max_pool2d_with_indices", "aten::max_pool2d_with_indices"},
        {"broadcast_to", "aten::broadcast_to"},
        {"sum_to_size", "aten::sum_to_size"},
        {"take_along_dim_out", "aten::take_along_dim.out"},
        {"convolution_backward", "aten::convolution_backward"},
        {"native_layer_norm", "aten::native_layer_norm"},
        {"_log_softmax_backward_data_out", "aten::_log_softmax_backward_data.out"},
        {"_cast_Byte", "aten::_cast_Byte"},
        {"matrix_H", "aten::matrix_H"},
        {"arange_start_step", "aten::arange.start_step"},
        {"avg_pool2d_backward_grad_input", "aten::avg_pool2d_backward.grad_input"},
        {"upsample_nearest2d_vec", "aten::upsample_nearest2d.vec"},
        {"index_put_", "aten::index_put_"},
        {"copy_", "aten::copy_"},
        {"view", "aten::view"},
        {"view_dtype", "aten::view.dtype"},
        {"to_dtype_layout", "aten::to.dtype_layout"},
        {"empty_memory_format", "aten::empty.memory_format"},
        {"div_Tensor_mode", "aten::div.Tensor_mode"},
        {"std_correction_names_out", "aten::std.correction_names_out"},
    };
    for (const auto& [st, want] : cases) EXPECT_EQ(aten(st), want) << st;
}

TEST(DeriveName, AtenOddInputsFallBack) {
    // Not at::_ops: the plain rule (no parameters).
    EXPECT_EQ(derive_name(aten_rule(), "_Z3foov", "foo()"), "foo");
    // A struct name newer than the table: unsplit but stable.
    EXPECT_EQ(aten("frobnicate_NewOverload2099"), "aten::frobnicate_NewOverload2099");
}

TEST(DeriveName, PlainAndExplicitName) {
    SymbolRule r;
    EXPECT_EQ(derive_name(r, "ncclAllReduce", ""), "ncclAllReduce");
    EXPECT_EQ(derive_name(r, "ncclAllReduce", "ncclAllReduce"), "ncclAllReduce");
    EXPECT_EQ(derive_name(r, "_ZN4c10d16ProcessGroupGloo9allreduceERSt6vectorIN2at6TensorESaIS3_EERKNS_16AllreduceOptionsE",
                          "c10d::ProcessGroupGloo::allreduce(std::vector<at::Tensor, std::allocator<at::Tensor> >&, "
                          "c10d::AllreduceOptions const&)"),
              "c10d::ProcessGroupGloo::allreduce");
    r.info.name = "fixed";
    EXPECT_EQ(derive_name(r, "x", "x"), "fixed");
}

// Every operator of the installed ATen headers: struct -> name + "." + overload_name.
std::vector<fs::path> aten_ops_dirs() {
    std::vector<fs::path> out;
    for (const char* d : {"/usr/include/ATen/ops", "/usr/lib/python3/dist-packages/torch/include/ATen/ops",
                          "/usr/local/include/ATen/ops"})
        if (fs::is_directory(d)) out.emplace_back(d);
    return out;
}

TEST(DeriveName, EveryOperatorOfTheInstalledAtenHeaders) {
    auto dirs = aten_ops_dirs();
    if (dirs.empty()) GTEST_SKIP() << "no ATen headers (ATen/ops/*_ops.h) installed: libtorch-dev";
    size_t total = 0, pass = 0;
    std::vector<std::string> failures;
    // The quoted string after `key` within [from, limit), or npos.
    auto quoted = [](const std::string& t, const std::string& key, size_t from, size_t limit, std::string& out) {
        size_t k = t.find(key, from);
        if (k == std::string::npos || k >= limit) return false;
        size_t b = k + key.size(), e = t.find('"', b);
        if (e == std::string::npos) return false;
        out = t.substr(b, e - b);
        return true;
    };
    for (const auto& e : fs::directory_iterator(dirs.front())) {
        std::string fn = e.path().filename().string();
        if (!fn.ends_with("_ops.h")) continue;
        std::ifstream in(e.path());
        std::stringstream ss;
        ss << in.rdbuf();
        const std::string text = ss.str();
        const std::string kStruct = "struct TORCH_API ";
        for (size_t pos = text.find(kStruct); pos != std::string::npos; pos = text.find(kStruct, pos + 1)) {
            size_t b = pos + kStruct.size(), end = text.find(' ', b);
            size_t close = text.find("};", b);
            std::string st = text.substr(b, end - b), name, overload;
            if (!quoted(text, "(name, \"", b, close, name) ||
                !quoted(text, "(overload_name, \"", b, close, overload))
                continue;
            std::string want = name + (overload.empty() ? "" : "." + overload);
            std::string got = aten(st);
            ++total;
            if (got == want) ++pass;
            else if (failures.size() < 50) failures.push_back(st + " -> " + got + " (want " + want + ")");
        }
    }
    ASSERT_GT(total, 1000u) << "parsed too few operators from " << dirs.front();
    std::string list;
    for (const auto& f : failures) list += "\n  " + f;
    EXPECT_EQ(pass, total) << pass << "/" << total << " operators named right; first failures:" << list;
    std::printf("[ aten names ] %zu/%zu operators of %s named right\n", pass, total, dirs.front().c_str());
}

// ---- the torch specs against the real library ---------------------------------------

std::string find_libtorch_cpu() {
    for (const char* p : {"/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13.0", "/usr/lib/x86_64-linux-gnu/libtorch_cpu.so"})
        if (fs::exists(p)) return fs::canonical(p).string();
    return {};
}

using test::builtin;

TEST(TorchSpecs, LibraryGlobs) {
    EXPECT_TRUE(builtin("torch-aten").matches_library("/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13.0"));
    EXPECT_TRUE(builtin("torch-aten").matches_library("/x/site-packages/torch/lib/libtorch_cpu.so"));
    EXPECT_FALSE(builtin("torch-aten").matches_library("/usr/lib/x86_64-linux-gnu/libtorch_python.so.1.13"));
    EXPECT_TRUE(builtin("torch-c10d").matches_library("/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13"));
    EXPECT_TRUE(builtin("torch-c10d").matches_library("/x/torch/lib/libtorch_cuda.so"));
}

TEST(TorchSpecs, AtenPlanOnRealLibtorch) {
    std::string lib = find_libtorch_cpu();
    if (lib.empty()) GTEST_SKIP() << "libtorch_cpu.so not installed (python3-torch)";
    SymbolTable syms;
    auto t0 = std::chrono::steady_clock::now();
    auto plan = ProbeAttacher::plan(builtin("torch-aten"), lib, syms);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(plan.ok()) << plan.error();
    std::printf("[ torch-aten ] %zu entry probes planned on %s in %.0f ms\n", plan->offsets.size(), lib.c_str(), ms);
    EXPECT_GT(plan->offsets.size(), 2000u);
    EXPECT_TRUE(plan->ret_offsets.empty()) << "return probes on ATen: the uretprobe hazard";
    std::set<std::string> names;
    for (auto c : plan->cookies) {
        const SymbolInfo* s = syms.from_cookie(c);
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(s->role, CD_ROLE_OP);
        EXPECT_EQ(s->layer, "aten");
        names.insert(s->name);
    }
    for (const char* want : {"aten::addmm", "aten::linear", "aten::mm", "aten::add.Tensor", "aten::add.out",
                             "aten::_to_copy", "aten::sum.dim_IntList", "aten::t"})
        EXPECT_TRUE(names.count(want)) << want;
    for (const auto& n : names) EXPECT_TRUE(n.starts_with("aten::")) << n;
}

TEST(TorchSpecs, C10dPlanOnRealLibtorch) {
    std::string lib = find_libtorch_cpu();
    if (lib.empty()) GTEST_SKIP() << "libtorch_cpu.so not installed (python3-torch)";
    SymbolTable syms;
    auto plan = ProbeAttacher::plan(builtin("torch-c10d"), lib, syms);
    ASSERT_TRUE(plan.ok()) << plan.error();
    EXPECT_TRUE(plan->ret_offsets.empty());
    std::map<std::string, cd_coll> got;
    std::map<std::string, uint32_t> notes;  // c10d group and store constructors: their tails
    for (auto c : plan->cookies) {
        const SymbolInfo* s = syms.from_cookie(c);
        ASSERT_NE(s, nullptr);
        if (s->role == CD_ROLE_COMM_INIT) {
            notes[s->name] = s->tail;
            // `this`, then the by-reference store (and a store's prefix)
            EXPECT_EQ(s->slots.redop, 0) << s->name;
            EXPECT_EQ(s->slots.dtype, s->tail == CD_TAIL_C10D_STORE ? 2 : 1) << s->name;
            continue;
        }
        EXPECT_EQ(s->role, CD_ROLE_COLLECTIVE) << s->name;
        got[s->name] = s->coll;
    }
    // torch 1.13 names a group only through the PrefixStore its
    // constructor gets (distributed_c10d.py): both are noted.
    EXPECT_EQ(notes, (std::map<std::string, uint32_t>{{"c10d::PrefixStore::PrefixStore", CD_TAIL_C10D_STORE},
                                                      {"c10d::ProcessGroupGloo::ProcessGroupGloo", CD_TAIL_C10D_GROUP}}));
    std::string listing;
    for (const auto& [n, k] : got) listing += "\n  " + n + " " + std::string(coll_name(k));
    std::printf("[ torch-c10d ] %zu probes on %s:%s\n", got.size(), lib.c_str(), listing.c_str());
    // What libtorch_cpu 1.13 exports for ProcessGroupGloo.
    const std::map<std::string, cd_coll> want = {
        {"c10d::ProcessGroupGloo::allreduce", CD_COLL_ALL_REDUCE},
        {"c10d::ProcessGroupGloo::allreduce_coalesced", CD_COLL_ALL_REDUCE},
        {"c10d::ProcessGroupGloo::allgather", CD_COLL_ALL_GATHER},
        {"c10d::ProcessGroupGloo::_allgather_base", CD_COLL_ALL_GATHER},
        {"c10d::ProcessGroupGloo::broadcast", CD_COLL_BROADCAST},
        {"c10d::ProcessGroupGloo::alltoall_base", CD_COLL_ALL_TO_ALL},
        {"c10d::ProcessGroupGloo::barrier", CD_COLL_BARRIER},
        {"c10d::ProcessGroupGloo::send", CD_COLL_SEND},
        {"c10d::ProcessGroupGloo::recv", CD_COLL_RECV},
    };
    for (const auto& [n, k] : want) {
        auto it = got.find(n);
        ASSERT_NE(it, got.end()) << n << " not probed";
        EXPECT_EQ(it->second, k) << n;
    }
}

}  // namespace
}  // namespace commdbg::capture

// The cookie's tensor parameters (events.h, bits 60..63) from a c10d
// method's signature, as libstdc++'s demangler spells it.
TEST(ProbeSpec, C10dTensorParamsFollowTheSignature) {
    using commdbg::capture::c10d_tensor_params;
    const std::string v = "std::vector<at::Tensor, std::allocator<at::Tensor> >";
    const std::string vv = "std::vector<" + v + ", std::allocator<" + v + " > >";
    EXPECT_EQ(c10d_tensor_params("c10d::ProcessGroupGloo::allreduce(" + v + "&, c10d::AllreduceOptions const&)"),
              CD_TPARAM_VECTOR);
    EXPECT_EQ(c10d_tensor_params("c10d::ProcessGroupGloo::allgather(" + vv + "&, " + v +
                                 "&, c10d::AllgatherOptions const&)"),
              CD_TPARAM_VECTOR_VECTOR | CD_TPARAM_VECTOR << 2);
    EXPECT_EQ(c10d_tensor_params("c10d::ProcessGroupGloo::_allgather_base(at::Tensor&, at::Tensor&, "
                                 "c10d::AllgatherOptions const&)"),
              CD_TPARAM_TENSOR | CD_TPARAM_TENSOR << 2);
    EXPECT_EQ(c10d_tensor_params("c10d::ProcessGroupGloo::scatter(" + v + "&, " + vv + "&, c10d::ScatterOptions const&)"),
              CD_TPARAM_VECTOR | CD_TPARAM_VECTOR_VECTOR << 2);
    EXPECT_EQ(c10d_tensor_params("c10d::ProcessGroupGloo::send(" + v + "&, int, int)"), CD_TPARAM_VECTOR);
    // No tensor first: nothing is read, whatever follows.
    EXPECT_EQ(c10d_tensor_params("c10d::ProcessGroupGloo::barrier(c10d::BarrierOptions const&)"), 0);
    EXPECT_EQ(c10d_tensor_params("c10d::ProcessGroupGloo::f(int, at::Tensor&)"), 0);
    // By value or rvalue: not the layout the kernel reads.
    EXPECT_EQ(c10d_tensor_params("c10d::X::f(at::Tensor, at::Tensor&)"), 0);
    EXPECT_EQ(c10d_tensor_params("c10d::X::f(at::Tensor&&)"), 0);
    EXPECT_EQ(c10d_tensor_params("ncclAllReduce"), 0);
}
