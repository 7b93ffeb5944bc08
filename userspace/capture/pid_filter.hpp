// SPDX-License-Identifier: Apache-2.0
// Whether this kernel's per-process uprobe filter (a uprobe_multi link's pid)
// runs the program for every thread of that process.  As the filter came
// (Linux 6.6) it matched only the thread the pid names, until a 2024 fix
// (same_thread_group); on such a kernel a filtered session would miss every
// other thread's calls without saying so (docs/safety.md).
#pragma once

#include "result.hpp"

namespace commdbg::capture {

// A filtered probe on commdbg's own code, for this process, hit once from a
// second thread: true when the program ran for it; else why not.  Checked
// once per commdbg process; later calls return the first answer.
Result<bool> pid_filter_covers_process();

}  // namespace commdbg::capture
