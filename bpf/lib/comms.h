/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Communicators, kept in the kernel (`comms`, events.h cd_comm_key/val) so
 * that they survive record drops: noted at the return of the call that
 * created, split or ended one.
 */
#ifndef COMMDBG_LIB_COMMS_H
#define COMMDBG_LIB_COMMS_H

#include "lib/cxx_string.h"
#include "lib/drops.h"
#include "lib/entry.h"
#include "lib/records.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cd_comm_key);
	__type(value, struct cd_comm_val);
} comms SEC(".maps");

/* A cd_comm_val is built here: too large for the BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cd_comm_val);
} comm_scratch SEC(".maps");

/* Remember a communicator created by the call that just returned. */
FUNC_INLINE void note_comm(const struct cd_inflight *call, struct cd_thread *st, __u64 comm, __u32 role,
			   __s32 split_index)
{
	struct cd_comm_key k = {.tgid = call->ckey.tgid, .comm = comm};
	__u32 zero = 0;
	struct cd_comm_val *v = bpf_map_lookup_elem(&comm_scratch, &zero);

	if (!v)
		return;
	__builtin_memset(v, 0, sizeof(*v));
	v->created_ns = call->ts;
	if (role == CD_ROLE_COMM_INIT) {
		v->origin = CD_COMM_FROM_ID;
		v->nranks = (__s32)slot_arg(call->args, CD_COOKIE_COUNT(call->cookie));
		v->rank = (__s32)slot_arg(call->args, CD_COOKIE_PEER(call->cookie));
		__builtin_memcpy(v->unique_id, st->unique_id, CD_UNIQUE_ID_BYTES);
	} else {
		v->origin = CD_COMM_FROM_SPLIT;
		v->nranks = -1;
		v->rank = -1;
		v->key = (__s32)slot_arg(call->args, CD_COOKIE_COUNT(call->cookie));
		v->color = (__s32)slot_arg(call->args, CD_COOKIE_PEER(call->cookie));
		v->parent = slot_arg(call->args, CD_COOKIE_COMM(call->cookie));
		v->split_index = split_index;
	}
	if (bpf_map_update_elem(&comms, &k, v, BPF_ANY))
		count_drop(CD_DROP_COMM_FULL);
}

/* ncclCommInitAll(comms, ndev, devlist): one comm per device. */
FUNC_INLINE void note_comm_list(const struct cd_inflight *call)
{
	__u64 ndev = slot_arg(call->args, CD_COOKIE_COUNT(call->cookie));
	__u64 n = ndev < CD_MAX_COMM_LIST ? ndev : CD_MAX_COMM_LIST;
	__u32 zero = 0;
	struct cd_comm_val *v = bpf_map_lookup_elem(&comm_scratch, &zero);

	if (!v)
		return;
	__builtin_memset(v, 0, sizeof(*v));
	for (__u32 i = 0; i < CD_MAX_COMM_LIST; i++) {
		struct cd_comm_key k = {.tgid = call->ckey.tgid};
		__u64 c = 0;

		if (i >= n)
			break;
		if (bpf_probe_read_user(&c, sizeof(c), (void *)(call->out_ptr + 8 * i)) || !c)
			continue;
		k.comm = c;
		v->origin = CD_COMM_FROM_ALL;
		v->nranks = (__s32)n;
		v->rank = (__s32)i;
		v->created_ns = call->ts;
		bpf_map_update_elem(&comms, &k, v, BPF_ANY);
	}
}

/* Communicators created, split or ended by the call that returned. */
FUNC_INLINE void track_comm(const struct cd_inflight *call, struct cd_thread *st, const struct ret_info *r)
{
	__u32 role = CD_COOKIE_ROLE(call->cookie), tail = CD_COOKIE_TAIL(call->cookie);
	__u64 comm_arg = slot_arg(call->args, CD_COOKIE_COMM(call->cookie));
	__s32 split_index = -1;

	if (role == CD_ROLE_COMM_SPLIT) {
		/* Every rank splits a parent in the same order, also ranks that get
		 * no child (NCCL_SPLIT_NOCOLOR): the n-th split is the same on all. */
		struct cd_comm_key pk = {.tgid = call->ckey.tgid, .comm = comm_arg};
		struct cd_comm_val *pv = bpf_map_lookup_elem(&comms, &pk);

		split_index = pv ? (__s32)__sync_fetch_and_add(&pv->nsplits, 1) : -1;
	}
	if (r->ret == 0 && r->out &&
	    (role == CD_ROLE_COMM_SPLIT || (role == CD_ROLE_COMM_INIT && tail == CD_TAIL_UNIQUE_ID)))
		note_comm(call, st, r->out, role, split_index);
	if (r->ret == 0 && role == CD_ROLE_COMM_INIT && tail == CD_TAIL_COMM_LIST && call->out_ptr)
		note_comm_list(call);
	if (role == CD_ROLE_COMM_END && comm_arg) {
		struct cd_comm_key k = {.tgid = call->ckey.tgid, .comm = comm_arg};
		struct cd_comm_val *v = bpf_map_lookup_elem(&comms, &k);

		if (v)
			v->destroyed = 1;
	}
}

/* ---- c10d process groups ------------------------------------------------
 * A process group has no id of its own that every rank shares.  The keys it
 * meets its peers under in the job's store do: torch gives each group a
 * PrefixStore chain (torch 1.13: PrefixStore(group_name, PrefixStore(
 * "default_pg", TCPStore)); 2.x adds a PrefixStore("cpu/", ...) per device
 * backend; distributed_c10d.py), the same on every rank of the group by
 * necessity.  Each store and group is noted here at its constructor's entry
 * (C++ may throw: no return probe) under the object's address, a store with
 * its prefix and inner store, a group with its store, rank and size;
 * userspace follows the chain (snapshot/comm_registry). */

/* Whether a CD_ROLE_COMM_INIT symbol is a c10d one (events.h, the tails). */
FUNC_INLINE bool is_c10d_note(__u64 cookie)
{
	__u32 tail = CD_COOKIE_TAIL(cookie);

	return tail == CD_TAIL_C10D_STORE || tail == CD_TAIL_C10D_GROUP;
}

/* The std::string at `str` into v->name, NUL-terminated; cut to fit. */
FUNC_INLINE void read_c10d_name(struct cd_comm_val *v, __u64 str)
{
	__u64 data, size;
	__u32 len;

	if (!read_std_string(str, &data, &size))
		return;
	len = size < sizeof(v->name) - 1 ? (__u32)size : sizeof(v->name) - 1;
	if (len && bpf_probe_read_user(v->name, len & (sizeof(v->name) - 1), (void *)data))
		__builtin_memset(v->name, 0, sizeof(v->name));
}

/* The Store* an intrusive_ptr<Store> at `p` holds (its one member). */
FUNC_INLINE __u64 read_store(__u64 p)
{
	__u64 store = 0;

	if (p && bpf_probe_read_user(&store, sizeof(store), (void *)p))
		store = 0;
	return store;
}

/* A constructor's object is new, whatever was at its address before. */
FUNC_INLINE void note_c10d(const struct entry *en)
{
	struct cd_comm_key k = {.tgid = en->tgid, .comm = slot_arg(en->args, CD_COOKIE_REDOP(en->cookie))};
	__u32 zero = 0;
	struct cd_comm_val *v = bpf_map_lookup_elem(&comm_scratch, &zero);

	if (!k.comm || !v)
		return;
	__builtin_memset(v, 0, sizeof(*v));
	v->split_index = -1;
	v->created_ns = en->ts;
	v->parent = read_store(slot_arg(en->args, CD_COOKIE_DTYPE(en->cookie)));
	if (CD_COOKIE_TAIL(en->cookie) == CD_TAIL_C10D_GROUP) {
		v->origin = CD_COMM_C10D_GROUP;
		v->rank = (__s32)slot_arg(en->args, CD_COOKIE_PEER(en->cookie));
		v->nranks = (__s32)slot_arg(en->args, CD_COOKIE_COUNT(en->cookie));
	} else {
		v->origin = CD_COMM_C10D_STORE;
		v->rank = -1;
		v->nranks = -1;
		read_c10d_name(v, slot_arg(en->args, CD_COOKIE_OUT(en->cookie)));
	}
	if (bpf_map_update_elem(&comms, &k, v, BPF_ANY))
		count_drop(CD_DROP_COMM_FULL);
}

#endif /* COMMDBG_LIB_COMMS_H */
