/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The flight recorder (events.h, cd_flight): the last CD_FLIGHT_SLOTS
 * collectives of each traced process's communicators, kept in the kernel.
 * Written at every counted collective's entry, and at a return-probed one's
 * return; read and cleared by userspace.
 */
#ifndef COMMDBG_LIB_FLIGHT_H
#define COMMDBG_LIB_FLIGHT_H

#include "lib/drops.h"
#include "lib/entry.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CD_FLIGHT_COMMS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cd_flight_key);
	__type(value, struct cd_flight);
} flight SEC(".maps");

/* Never written: the zeroes a new communicator's recorder starts from (too
 * large for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cd_flight);
} flight_zero SEC(".maps");

/* What a collective's signature holds beyond its kind. */
struct flight_sig {
	__u64 count; /* elements; CD_FLIGHT_NO_COUNT: unknown */
	__u32 dtype; /* as cd_flight_entry.dtype */
	__u32 op;    /* as cd_flight_entry.op */
	__u32 root;  /* as cd_flight_entry.root */
	__u32 pad;
};

/* Whether the call takes a number: a collective, not a send or receive. */
FUNC_INLINE bool flight_numbered(const struct entry *en)
{
	__u32 coll = CD_COOKIE_COLL(en->cookie);

	return coll != CD_COLL_SEND && coll != CD_COLL_RECV;
}

/* The communicator a collective is numbered on: NCCL's comm argument; a
 * framework (c10d) collective's process group, `this` (events.h: such a
 * method returns c10::intrusive_ptr<Work> in memory, `this` in slot 1), for
 * the outermost one of its thread only: torch 2.x's ProcessGroup::allreduce
 * calls its backend's, and Gloo's _allgather_base its allgather, and the one
 * collective the program issued takes one number.  0: none. */
FUNC_INLINE __u64 flight_comm(const struct entry *en, const struct cd_count_key *key)
{
	if (!CD_COOKIE_FRAMEWORK_COLL(en->cookie))
		return key->comm;
	return en->nested ? 0 : slot_arg(en->args, CD_TENSOR_THIS_SLOT);
}

/* Records the call; returns its number on the communicator, 0 if it could not
 * be kept.  `returns`: its return is probed and will be recorded; `sig`: its
 * count and datatype.  Global
 * (verified once): inlined, its branches multiplied call_enter's paths. */
FUNC_GLOBAL __u64 flight_record(const struct entry *en, const struct cd_count_key *key, bool returns,
				 const struct flight_sig *sig)
{
	struct cd_flight_key fk = {};
	struct cd_flight_entry *e;
	struct cd_flight *f;
	__u32 zero = 0;
	__u64 seq;

	if (!en || !key || !sig)
		return 0;
	fk.tgid = key->tgid;
	fk.comm = flight_comm(en, key);
	if (!fk.comm)
		return 0;
	f = bpf_map_lookup_elem(&flight, &fk);
	if (!f) {
		const struct cd_flight *z = bpf_map_lookup_elem(&flight_zero, &zero);

		if (!z)
			return 0;
		bpf_map_update_elem(&flight, &fk, z, BPF_NOEXIST);
		f = bpf_map_lookup_elem(&flight, &fk);
		if (!f) {
			count_drop(CD_DROP_FLIGHT_FULL);
			return 0;
		}
	}
	seq = __sync_fetch_and_add(&f->seq, 1) + 1;
	e = &f->e[(seq - 1) & (CD_FLIGHT_SLOTS - 1)];
	e->enter_ns = en->ts ? en->ts : bpf_ktime_get_ns();
	e->return_ns = 0;
	e->state = returns ? CD_FLIGHT_IN_CALL : CD_FLIGHT_UNPROBED;
	e->status = 0;
	e->count = sig->count;
	e->tid = en->tid;
	e->sym = key->sym;
	e->dtype = sig->dtype;
	e->op = sig->op;
	e->root = sig->root;
	e->seq = seq;
	return seq;
}

/* A recorded call returned `ret`: its entry says so, unless 256 newer ones
 * of its communicator overwrote it meanwhile.  (One whose thread was nested
 * too deep to keep it in flight, counted as CD_DROP_INFLIGHT_DEEP, stays
 * "in the call".) */
FUNC_GLOBAL int flight_returned(const struct cd_inflight *call, __s64 ret)
{
	struct cd_flight_key fk = {};
	struct cd_flight_entry *e;
	struct cd_flight *f;

	if (!call || !call->flight_seq)
		return 0;
	fk.tgid = call->ckey.tgid;
	fk.comm = call->ckey.comm;
	f = bpf_map_lookup_elem(&flight, &fk);
	if (!f)
		return 0;
	e = &f->e[(call->flight_seq - 1) & (CD_FLIGHT_SLOTS - 1)];
	if (e->seq != call->flight_seq)
		return 0;
	e->return_ns = bpf_ktime_get_ns();
	e->status = (__s32)ret;
	e->state = CD_FLIGHT_RETURNED;
	return 1;
}

#endif /* COMMDBG_LIB_FLIGHT_H */
