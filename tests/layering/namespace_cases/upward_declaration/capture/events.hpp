// SPDX-License-Identifier: Apache-2.0
// A case for check_namespaces.py: a capture/ header that forward-declares a
// name of model/, the layer above it.  Never compiled.
#pragma once

namespace commdbg::model {
class ProcessTree;
}  // namespace commdbg::model

namespace commdbg::capture {
struct Event {
    const model::ProcessTree* tree;
};
}  // namespace commdbg::capture
