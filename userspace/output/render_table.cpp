// SPDX-License-Identifier: Apache-2.0
// The human table: an exact summary first (kernel counters, communicators,
// losses), then CommDebugMode's tracing table (type | indented detail).
#include <algorithm>
#include <cstdio>
#include <map>

#include "call_fields.hpp"
#include "nccl.hpp"
#include "render.hpp"
#include "text.hpp"
#include "wait_status.hpp"

namespace commdbg::output {

namespace {

using namespace render_parts;

constexpr const char* kReset = "\x1b[0m";
constexpr const char* kWarn = "\x1b[1;31m";
constexpr const char* kBold = "\x1b[1m";

const char* kind_color(model::RecordKind k) {
    switch (k) {
    case model::RecordKind::Collective: return "\x1b[1;33m";
    case model::RecordKind::Op: return "\x1b[36m";
    case model::RecordKind::Module: return "\x1b[35m";
    case model::RecordKind::Scope: return "\x1b[34m";
    }
    return "";
}

std::string us(uint64_t ns) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1fus", static_cast<double>(ns) / 1000.0);
    return buf;
}

class TableWriter {
public:
    TableWriter(const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms, int noise, bool color)
        : p_(p), syms_(syms), noise_(noise), color_(color) {}

    std::string render() {
        summary();
        tracing_table();
        return std::move(out_);
    }

private:
    std::string paint(const char* code, std::string_view s) const {
        if (!color_) return std::string(s);
        return std::string(code) + std::string(s) + kReset;
    }
    void line(const std::string& s) { out_ += s + "\n"; }

    void summary() {
        std::string head = "commdbg: pid " + std::to_string(p_.pid);
        if (!p_.command.empty()) head += " (" + p_.command + ")";
        if (p_.exit_code) head += " " + describe_exit(host::decode_exit(*p_.exit_code));
        line(paint(kBold, head));
        if (!p_.libraries.empty()) {
            std::string libs = "libraries:";
            for (const auto& l : p_.libraries) libs += " " + l;
            line(libs);
        }

        auto by_kind = coll_summary(p_, syms_);
        line("collectives (exact kernel counters):");
        if (by_kind.empty()) line("  (none)");
        for (const auto& [key, sum] : by_kind) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "  %-24s calls=%-8llu bytes=%llu", key.c_str(),
                          static_cast<unsigned long long>(sum.calls),
                          static_cast<unsigned long long>(sum.bytes));
            std::string row = buf;
            if (sum.errors) row += " " + paint(kWarn, "errors=" + std::to_string(sum.errors));
            line(row);
        }
        line("  total (each logical collective once): " +
             std::to_string(total_counts(p_, syms_)));

        if (!p_.comms.empty()) {
            line("communicators:");
            for (const snapshot::CommInfo& c : p_.comms) {
                std::string row = "  id=" + (c.id ? hex16(*c.id) : std::string("unknown"));
                row += " nranks=" + (c.nranks >= 0 ? std::to_string(c.nranks) : "?");
                row += " rank=" + (c.rank >= 0 ? std::to_string(c.rank) : "?");
                row += " origin=" + std::string(to_string(c.origin)) + " ptr=" + hex(c.ptr);
                if (c.parent_ptr) row += " parent=" + hex(*c.parent_ptr);
                if (c.init_ret && *c.init_ret != 0) row += " init_ret=" + std::to_string(*c.init_ret);
                if (c.destroyed) row += " destroyed";
                line(row);
            }
        }

        uint64_t budget = p_.tree ? p_.tree->dropped(model::DropCause::Budget) : 0;
        uint64_t depth = p_.tree ? p_.tree->dropped(model::DropCause::Depth) : 0;
        uint64_t missing = p_.kernel_dropped_records + budget + depth;
        if (p_.counter_breakdown_lost) line(paint(kWarn, "warning: " + std::to_string(p_.counter_breakdown_lost) + " calls counted without communicator and datatype (the kernel's counter keys ran out); the counts per kind are exact"));
        if (missing > 0) {
            line("dropped records: kernel ring buffer " + std::to_string(p_.kernel_dropped_records) +
                 ", model budget " + std::to_string(budget) + ", model depth " +
                 std::to_string(depth));
            uint64_t retained = p_.tree ? p_.tree->records().size() : 0;
            line(paint(kWarn, "warning: the call tree below is incomplete: " +
                                  std::to_string(missing) + " calls missing, " +
                                  std::to_string(retained) +
                                  " shown; the counts above are exact"));
        }
        if (p_.tree && p_.tree->unmatched_exits() > 0)
            line("unmatched exits (ignored): " + std::to_string(p_.tree->unmatched_exits()));
        for (const auto& n : p_.notes) line("note: " + n);
        if (p_.fsdp) fsdp_section(*p_.fsdp);
    }

    void fsdp_section(const fsdp::Findings& r) {
        std::string text = fsdp::render_section(r);
        const bool bad = !r.violations.empty();
        for (size_t from = 0, nl; (nl = text.find('\n', from)) != std::string::npos; from = nl + 1) {
            std::string l = text.substr(from, nl - from);
            line(from == 0 ? paint(kBold, l) : bad && l.rfind("  violations", 0) == 0 ? paint(kWarn, l) : l);
        }
    }

    void tracing_table() {
        line("");
        line(paint(kBold, "Type        Detail"));
        line(std::string(10, '-') + "  " + std::string(66, '-'));
        if (!p_.tree || p_.tree->roots().empty()) {
            line("(no records)");
            return;
        }
        const auto& recs = p_.tree->records();
        auto tids = p_.tree->threads();
        // Threads are separate stacks: group roots per thread when there are several.
        if (tids.size() <= 1) {
            for (uint32_t r : p_.tree->roots()) emit(r, 0);
            return;
        }
        for (uint32_t tid : tids) {
            size_t before = out_.size();
            line("thread " + std::to_string(tid));
            size_t header_end = out_.size();
            for (uint32_t r : p_.tree->roots())
                if (recs[r].tid == tid) emit(r, 0);
            if (out_.size() == header_end) out_.resize(before);  // nothing visible
        }
    }

    void emit(uint32_t idx, int level) {
        const auto& recs = p_.tree->records();
        const model::Record& r = recs[idx];
        int child_level = level;
        if (record_visible(r, syms_, noise_)) {
            std::string type = to_string(r.kind);
            std::string cell = type + std::string(12 - type.size(), ' ');
            line(paint(kind_color(r.kind), cell) + std::string(2 * level, ' ') + detail(r));
            child_level = level + 1;
        }
        for (uint32_t c = r.first_child; c != model::kNoRecord; c = recs[c].next_sibling)
            emit(c, child_level);
    }

    // "scope NAME", "module PATH (Class) forward", or the name, then the
    // call's fields (call_fields.hpp) in table order; from level 2, where in
    // the Python code it was made.
    std::string detail(const model::Record& r) const {
        std::string d = context_detail(r);
        if (d.empty()) d = record_name(r, syms_);
        fields_detail(r, d);
        if (noise_ >= 2) {
            if (std::string at = py_location(r, *p_.tree); !at.empty()) d += " at " + at;
        }
        return d;
    }

    std::string context_detail(const model::Record& r) const {
        if (!model::ProcessTree::has_context(r)) return {};
        std::string name(p_.tree->context_name(r));
        if (r.kind == model::RecordKind::Scope) return "scope " + name;
        std::string cls(p_.tree->module_class(r));
        std::string node(p_.tree->autograd_node(r));
        return "module " + name + (cls.empty() ? "" : " (" + cls + ")") +
               (r.has(model::kRecompute) ? " recompute"
                : r.has(model::kBackward) ? " backward"
                                          : " forward") +
               (node.empty() ? "" : " [" + node + "]");
    }

    void fields_detail(const model::Record& r, std::string& d) const {
        auto fields = meaning::call_fields(r, p_, syms_);
        std::stable_sort(fields.begin(), fields.end(), [](const meaning::CallField& a, const meaning::CallField& b) {
            return a.table_order < b.table_order;
        });
        for (const meaning::CallField& f : fields) {
            if (f.show == meaning::TableShow::Never || noise_ < f.min_noise) continue;
            std::string value = f.type == meaning::FieldType::Nanos ? us(f.u) + " (host)" : field_text(f);
            if (f.show == meaning::TableShow::Bare) {
                d += " " + value;
                continue;
            }
            std::string kv = std::string(f.table_key) + "=" + value;
            d += " " + (f.show == meaning::TableShow::Warn && f.i != 0 ? paint(kWarn, kv) : kv);
        }
    }

    const snapshot::ProcessSnapshot& p_;
    const capture::SymbolTable& syms_;
    int noise_;
    bool color_;
    std::string out_;
};

}  // namespace

std::string render_table(const snapshot::ProcessSnapshot& p, const capture::SymbolTable& syms, int noise_level,
                         bool color) {
    return TableWriter(p, syms, noise_level, color).render();
}

}  // namespace commdbg::output
