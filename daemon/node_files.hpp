// SPDX-License-Identifier: Apache-2.0
// Probed library files that were deleted or replaced (a new NCCL installed
// over the old one): their probes go once no process maps them any more.
#pragma once

namespace commdbg {

class BpfSession;
class ProbeAttacher;

void detach_deleted_files(ProbeAttacher& attacher, BpfSession& bpf);

}  // namespace commdbg
