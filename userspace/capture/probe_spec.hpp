// SPDX-License-Identifier: Apache-2.0
// Probes are data: a ProbeSpec names a library, a symbol selection, a role
// and an argument layout.  Built-in specs are JSON files under specs/,
// compiled into the binary; users add theirs with --probes FILE.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "elf_symbols.hpp"
#include "pattern.hpp"
#include "result.hpp"
#include "symbol_table.hpp"

namespace commdbg::capture {

// How a record's display name is derived from the symbol.
enum class NameFrom {
    Plain,   // the symbol as is ("ncclAllReduce"), demangled without parameters for C++
    AtenOp,  // at::_ops::add_Tensor::call -> aten::add.Tensor
};

// A rule that applies only where a file beside the library holds (or,
// `unless`, does not hold) a text: which of two ways a build works, as its
// own files say (torch >= 2's record_function exit, specs/torch-scopes.json).
struct FileCondition {
    std::vector<std::string> paths;  // relative to the library's directory: "../autograd/profiler.py"
    std::string contains;            // holds where one of them has it in its first kMaxBytes
    bool unless = false;   // "unless_file": applies where the file lacks it, or cannot be read
    static constexpr size_t kMaxBytes = size_t{4} << 20;
};

struct SymbolRule {
    std::string match;                 // exact symbol name (mangled or plain)
    std::string glob;                  // or: glob over the demangled name
    std::optional<Pattern> regex;      // or: regex (RE2, found anywhere) over the demangled name
    std::string regex_text;
    SymbolInfo info;                   // role, collective, slots, tail (name/layer filled per symbol)
    NameFrom name_from = NameFrom::Plain;
    std::optional<bool> py_stack;      // "py_stack" in the spec; unset: by role (default_py_stack)
    std::optional<FileCondition> when;  // "if_file" / "unless_file": where the rule applies
};

// Where a derivation (ProbeSpec::derive) puts a rule's probes in one file.
struct DerivedSites {
    std::vector<host::ElfSymbol> at;  // the addresses, as symbols named by the rule
    std::string note;                 // none found: why; some: what the session notes about them
    bool elsewhere = false;           // none here by design: another file of the spec holds them (no note)
};

struct ProbeSpec {
    std::string name;     // "nccl"
    std::string source;   // "built-in" or the file it came from
    std::string description;
    std::string layer;    // "nccl", "c10d", "aten"
    std::vector<std::string> library;  // basename globs
    std::vector<std::string> exclude;  // basename globs never probed
    bool return_probes = false;        // only for APIs that cannot throw
    // "tensors": "c10d": the symbols are c10d process-group methods whose
    // at::Tensor parameters the kernel reads (c10d_tensor_params).
    bool c10d_tensors = false;
    std::vector<SymbolRule> symbols;
    // Set at run time, never parsed: symbols it picks (by their role and
    // derived name) are not probed — the session's outputs could never show
    // their records (TraceSession: the trivial ops below noise level 3).
    std::function<bool(const SymbolInfo&)> skip;
    std::string skip_why;  // what a note says when `skip` leaves out every symbol of a file
    // Set at run time, never parsed: a "match" rule whose name the file's
    // symbol tables lack is probed where this finds it in the file's own
    // code (a higher layer's derivation: torch's record_function exit, a
    // static function; the module entry, a call inside a lambda).
    std::function<DerivedSites(const std::string& path, std::string_view name)> derive;

    bool matches_library(std::string_view path) const;
};

// Parses one spec; an error names the source, the field and the problem.
Result<ProbeSpec> parse_probe_spec(std::string_view json_text, const std::string& source);

// Specs compiled into the binary (specs/*.json), in name order.
const std::vector<ProbeSpec>& builtin_specs();

// "nccl,torch-c10d" or a path to a JSON file, or empty for all built-ins.
// Errors for one entry are appended to `errors`; the others are still returned.
std::vector<ProbeSpec> select_specs(const std::vector<std::string>& names,
                                    std::vector<std::string>& errors);

bool glob_match(std::string_view pattern, std::string_view text);

// The beginnings of the file names the specs' libraries match ("libnccl.so",
// "libtorch_cpu.so"): each glob up to its first wildcard, those another
// covers left out; for the kernel's check of a new mapping (BpfOptions).
std::vector<std::string> file_prefixes_of(const std::vector<ProbeSpec>& specs);

// The cookie's tensor-parameter kinds (events.h, bits 60..63) of a c10d
// process-group method, from its demangled signature: its first two
// parameters, each an at::Tensor&, a std::vector<at::Tensor>& or a
// std::vector<std::vector<at::Tensor>>&.  0 when the first is none of them.
uint8_t c10d_tensor_params(std::string_view demangled);

// Display name of `symbol` (mangled) for `rule`.
std::string derive_name(const SymbolRule& rule, const std::string& symbol,
                        const std::string& demangled);

}  // namespace commdbg::capture
