// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The baseline for bench/: the cost of a uprobe that runs a BPF program
 * which does nothing, so the bench can tell trap cost from our work. */
#include "vmlinux.h"

#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("uprobe.multi")
int empty_enter(struct pt_regs *ctx)
{
	return 0;
}
