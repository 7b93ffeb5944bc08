// SPDX-License-Identifier: Apache-2.0
// commdbg probes list | check FILE: what the probe specs are.
#include <iostream>

#include "commands.hpp"
#include "probe_spec.hpp"

namespace commdbg::cli {

namespace {

void print_spec(const capture::ProbeSpec& s) {
    std::string libs;
    for (const auto& l : s.library) libs += (libs.empty() ? "" : ",") + l;
    std::cout << s.name << "\t" << s.layer << "\t" << libs << "\t" << s.symbols.size() << " rule(s)\t"
              << (s.return_probes ? "entry+return" : "entry only") << "\t" << s.description << "\n";
}

}  // namespace

void register_probes(CLI::App& app) {
    CLI::App* sub = app.add_subcommand("probes", "Show or check probe specs");
    sub->require_subcommand(1);
    CLI::App* list = sub->add_subcommand("list", "List the built-in probe specs");
    list->callback([] {
        std::cout << "name\tlayer\tlibrary\trules\tprobes\tdescription\n";
        for (const auto& s : capture::builtin_specs()) print_spec(s);
        throw CommandDone{0};
    });
    auto files = std::make_shared<std::vector<std::string>>();
    CLI::App* check = sub->add_subcommand("check", "Parse spec files and report the first problem of each");
    check->add_option("file", *files, "Spec files")->required();
    check->callback([files] {
        std::vector<std::string> errors;
        auto specs = capture::select_specs(*files, errors);
        for (const auto& s : specs) print_spec(s);
        for (const auto& e : errors) std::cerr << "commdbg: " << e << "\n";
        // A spec that does not parse is a bad argument: a usage error, as everywhere.
        throw CommandDone{errors.empty() ? 0 : 2};
    });
}

}  // namespace commdbg::cli
