/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Exact call counters, which never depend on ring-buffer delivery: fine
 * keys (process, symbol, communicator, datatype) in the node's `counters`
 * map, within each process's share; past it, the process's own coarse slots
 * (events.h, cd_proc_counts).
 */
#ifndef COMMDBG_LIB_COUNTERS_H
#define COMMDBG_LIB_COUNTERS_H

#include "lib/drops.h"
#include "lib/entry.h"
#include "lib/process.h"
#include "nccl_dtype.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct cd_count_key);
	__type(value, struct cd_count_val);
} counters SEC(".maps");

FUNC_INLINE void add_count(struct cd_count_val *v, __u64 elements, __u64 bytes, bool nested)
{
	__sync_fetch_and_add(&v->calls, 1);
	__sync_fetch_and_add(&v->elements, elements);
	__sync_fetch_and_add(&v->bytes, bytes);
	if (nested) {
		__sync_fetch_and_add(&v->nested, 1);
		__sync_fetch_and_add(&v->nested_bytes, bytes);
	}
}

/* A call no counter took. */
FUNC_INLINE __u32 count_uncounted(struct cd_proc_counts *pc)
{
	if (pc)
		__sync_fetch_and_add(&pc->uncounted, 1);
	count_drop(CD_DROP_UNCOUNTED);
	return CD_COUNTED_NONE;
}

/* A collective whose fine key was refused: counted in the process's own slot
 * for its symbol (open addressing, claimed with a compare-and-swap). */
FUNC_GLOBAL __u32 count_coarse(struct cd_proc_counts *pc, __u32 sym, __u64 elements, __u64 bytes, bool nested)
{
	__u32 start = (sym * 2654435761u) >> 26; /* top 6 bits: CD_COARSE_SLOTS */

	if (!pc)
		return count_uncounted(pc);
	for (__u32 i = 0; i < CD_COARSE_SLOTS; i++) {
		__u32 idx = (start + i) & (CD_COARSE_SLOTS - 1);
		struct cd_coarse_slot *slot = &pc->coarse[idx];
		__u32 cur = slot->sym_plus1;

		if (cur == 0) {
			cur = __sync_val_compare_and_swap(&slot->sym_plus1, 0, sym + 1);
			if (cur == 0)
				cur = sym + 1;
		}
		if (cur != sym + 1)
			continue;
		add_count(&slot->val, elements, bytes, nested);
		__sync_fetch_and_add(&pc->breakdown_lost, 1);
		return CD_COUNTED_COARSE + idx;
	}
	return count_uncounted(pc);
}

/* Counts one call; returns where (CD_COUNTED_*).  A new fine key is taken
 * only within the process's share, so no process can fill the node's map. */
FUNC_INLINE __u32 count_call(struct cd_count_key *key, __u32 role, __u64 elements, __u64 bytes, bool nested)
{
	struct cd_count_val *v = bpf_map_lookup_elem(&counters, key);
	struct cd_proc_counts *pc;

	if (v) {
		add_count(v, elements, bytes, nested);
		return CD_COUNTED_FINE;
	}
	pc = proc_counts_get(key->tgid);
	/* Without its own counters (no memory for them) a process still gets
	 * fine keys: losing the call would be worse than an unbounded share. */
	if (!pc || pc->fine_keys < fine_keys_per_process) {
		struct cd_count_val zero = {};

		if (bpf_map_update_elem(&counters, key, &zero, BPF_NOEXIST) == 0 && pc)
			__sync_fetch_and_add(&pc->fine_keys, 1);
		v = bpf_map_lookup_elem(&counters, key);
		if (!v)
			count_drop(CD_DROP_COUNTER_FULL);
	} else {
		count_drop(CD_DROP_COUNTER_SHARE);
	}
	if (!v)
		return role == CD_ROLE_COLLECTIVE ? count_coarse(pc, key->sym, elements, bytes, nested)
						  : count_uncounted(pc);
	add_count(v, elements, bytes, nested);
	return CD_COUNTED_FINE;
}

/* Counts an entry; returns where (CD_COUNTED_*) and fills its counter key. */
FUNC_INLINE __u32 count_entry(const struct entry *en, struct cd_count_key *key)
{
	__u64 elements = 0, bytes = 0;
	__u32 ds = CD_COOKIE_DTYPE(en->cookie);

	key->tgid = en->tgid;
	key->sym = CD_COOKIE_SYM(en->cookie);
	key->comm = slot_arg(en->args, CD_COOKIE_COMM(en->cookie));
	key->dtype = CD_DTYPE_NONE;
	key->pad = 0;
	if (en->role == CD_ROLE_COLLECTIVE) {
		elements = slot_arg(en->args, CD_COOKIE_COUNT(en->cookie));
		if (ds < CD_NUM_ARGS) {
			key->dtype = (__u32)en->args[ds & 7];
			bytes = elements * dtype_size(key->dtype);
		}
	}
	if (!(en->flags & CD_TRACE_COUNT))
		return CD_COUNTED_NONE;
	return count_call(key, en->role, elements, bytes, en->nested);
}

/* A call that returned non-zero: an error where its entry counted it. */
FUNC_INLINE void count_error(const struct cd_inflight *call)
{
	if (call->counted == CD_COUNTED_FINE) {
		struct cd_count_val *v = bpf_map_lookup_elem(&counters, &call->ckey);

		if (v)
			__sync_fetch_and_add(&v->errors, 1);
	} else if (call->counted >= CD_COUNTED_COARSE) {
		__u32 tgid = call->ckey.tgid;
		struct cd_proc_counts *pc = bpf_map_lookup_elem(&proc_counts, &tgid);
		__u32 idx = (call->counted - CD_COUNTED_COARSE) & (CD_COARSE_SLOTS - 1);

		if (pc)
			__sync_fetch_and_add(&pc->coarse[idx].val.errors, 1);
	}
}

#endif /* COMMDBG_LIB_COUNTERS_H */
