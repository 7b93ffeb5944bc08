// SPDX-License-Identifier: Apache-2.0
// What one call means, decoded once.  A probe spec names which argument slot
// holds what (count, dtype, comm, peer, stream, ...); the model keeps those
// raw values in a Record.  call_fields() turns a Record into typed, ordered
// fields from its symbol's role -- a communicator init's "count" slot is its
// nranks, a split's "peer" slot its colour -- joined with what the window
// knows of its communicators.  The JSON dump, the trace's args and the
// tracing table only format these fields: a new argument is added here and in
// the spec, never in a renderer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model.hpp"
#include "symbol_table.hpp"

namespace commdbg::snapshot {
struct ProcessSnapshot;
}  // namespace commdbg::snapshot

namespace commdbg::meaning {

enum class FieldType : uint8_t {
    Int,    // signed integer
    UInt,   // unsigned integer (element and byte counts)
    Hex,    // address or handle: "0x1a2b"
    Hex16,  // 64-bit id: "0x%016x"
    Text,   // a name: "float32", "sum", "all_reduce"
    Nanos,  // a duration in ns: a number in JSON, microseconds in the table
};

// How (and whether) the tracing table shows a field.
enum class TableShow : uint8_t {
    Never,     // JSON and trace args only
    KeyValue,  // " key=value"
    Bare,      // " value" (a datatype, a reduction op)
    Warn,      // " key=value", painted as a warning when non-zero (ret)
};

struct CallField {
    std::string_view key;  // JSON and trace-args key; empty: table only
    FieldType type = FieldType::Int;
    int64_t i = 0;     // Int
    uint64_t u = 0;    // UInt, Hex, Hex16, Nanos
    std::string text;  // Text
    // The table: how it shows the field, under which key, in which position
    // (its order differs from the JSON's), and from which noise level.
    TableShow show = TableShow::Never;
    std::string_view table_key;
    int table_order = 0;
    int min_noise = 0;
};

// An ATen record's name as CommDebugMode keys the op (the OpOverload's
// str(): "aten::mm" -> "aten.mm.default"); nullopt for another name.
std::optional<std::string> op_name(std::string_view name);

// The fields of a collective-kind record (collectives and the communicator
// lifecycle), of a module record seen in Python stacks (module_fqn,
// module_class, event_type) or of an ATen op record (op_name), in JSON
// order; empty for other kinds.
std::vector<CallField> call_fields(const model::Record& r, const snapshot::ProcessSnapshot& p,
                                   const capture::SymbolTable& syms);

// The tensors a c10d collective was given, by side: a method's two tensor
// parameters are its outputs then its inputs (c10d's convention); one
// parameter is both (in place), but a send's only input and a recv's only
// output.  Indices into ProcessTree::tensor(); `total` counts every tensor
// the parameter held, read or not.
struct TensorSide {
    bool present = false;
    std::vector<uint32_t> rows;
    uint32_t total = 0;
};
struct TensorSides {
    TensorSide in, out;
};
TensorSides tensor_sides(const model::Record& r, const model::ProcessTree& t);

// "[4, 8]" for a tensor whose shape was read; its status otherwise ("undefined").
std::string shape_text(const model::ProcessTree& t, const model::ProcessTree::TensorInfo& row);
const char* to_string(model::ProcessTree::TensorStatus s);

// A field's value as JSON / table text.
std::string field_text(const CallField& f);

}  // namespace commdbg::meaning
