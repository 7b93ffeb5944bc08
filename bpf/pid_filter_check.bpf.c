// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The self-check behind attach --no-follow's per-process probes
 * (userspace/capture/pid_filter.cpp): counts its runs, nothing else. */
#include "vmlinux.h"

#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

__u64 hits = 0;

SEC("uprobe.multi")
int filter_hit(struct pt_regs *ctx)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}
