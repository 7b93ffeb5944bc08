/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Kernel-side losses: every one counted, by cause (events.h, cd_drop_cause),
 * and call records lost to a full ring buffer also per process. */
#ifndef COMMDBG_LIB_DROPS_H
#define COMMDBG_LIB_DROPS_H

#include "lib/compiler.h"
#include "events.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CD_DROP_MAX);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

/* tgid -> call records lost to a full ring buffer, so each process reports its own. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} proc_drops SEC(".maps");

FUNC_INLINE void count_drop(__u32 cause)
{
	__u64 *v = bpf_map_lookup_elem(&drops, &cause);

	if (v)
		*v += 1;
}

FUNC_INLINE void count_ringbuf_drop(__u32 tgid)
{
	__u64 *v = bpf_map_lookup_elem(&proc_drops, &tgid);

	count_drop(CD_DROP_RINGBUF_FULL);
	if (v) {
		__sync_fetch_and_add(v, 1);
	} else {
		__u64 one = 1;

		if (bpf_map_update_elem(&proc_drops, &tgid, &one, BPF_NOEXIST)) {
			v = bpf_map_lookup_elem(&proc_drops, &tgid);
			if (v)
				__sync_fetch_and_add(v, 1);
		}
	}
}

#endif /* COMMDBG_LIB_DROPS_H */
