// SPDX-License-Identifier: Apache-2.0
// A case for check_namespaces.py: a model/ header whose names sit in the root
// namespace, not in commdbg::model.  Never compiled.
#pragma once

namespace commdbg {
struct Record {
    int depth;
};
}  // namespace commdbg
