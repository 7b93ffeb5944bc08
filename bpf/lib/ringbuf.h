/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The `events` ring buffer every record goes to: the header each starts
 * with, and when a record wakes the consumer. */
#ifndef COMMDBG_LIB_RINGBUF_H
#define COMMDBG_LIB_RINGBUF_H

#include "lib/config.h"
#include "events.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* userspace resizes before load */
} events SEC(".maps");

/* Wake-up flags for a call record: none while the buffer fills, forced past
 * the watermark (config.h, wakeup_bytes). */
FUNC_INLINE __u64 record_wakeup(void)
{
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP
									   : BPF_RB_NO_WAKEUP;
}

/* Every record starts with the same header. */
FUNC_INLINE void fill_header(struct cd_header *h, __u32 kind, __u32 size, __u32 tail_kind, __u32 tail_len,
			     __u32 tgid, __u32 tid, __u64 ts)
{
	h->kind = kind;
	h->size = size;
	h->tail_kind = tail_kind;
	h->tail_len = tail_len;
	h->tgid = tgid;
	h->tid = tid;
	h->ts_ns = ts;
}

#endif /* COMMDBG_LIB_RINGBUF_H */
