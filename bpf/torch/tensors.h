/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The tensors a c10d process-group method was given, and its group's rank
 * and size, read at entry (events.h, cd_tensors).  Every offset comes from
 * userspace (cd_torch_cfg; userspace/torch/), derived from the process's own
 * libc10 and libtorch files; nothing is read of an object whose vtable is
 * not the one userspace named.  Sent in front of the record's context.
 */
#ifndef COMMDBG_TORCH_TENSORS_H
#define COMMDBG_TORCH_TENSORS_H

#include "lib/entry.h"
#include "lib/flight.h"
#include "python/record_buf.h"

/* tgid -> how to read its tensors and process groups, set by userspace for
 * traced processes that map libc10 and a probed libtorch. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct cd_torch_cfg);
} torch_procs SEC(".maps");

/* Looked up only for a record of a method with tensor parameters. */
FUNC_INLINE const struct cd_torch_cfg *torch_cfg_for(__u64 cookie, __u32 tgid)
{
	return CD_COOKIE_TENSORS(cookie) ? bpf_map_lookup_elem(&torch_procs, &tgid) : 0;
}

FUNC_INLINE struct cd_tensors *record_tensors(struct record_buf *b)
{
	return (struct cd_tensors *)(b->head + TENSORS_OFF);
}

/* Fields of the TensorImpl copied to b->impl (span bytes of it). */
#define IMPL_AT(b, off) ((b)->impl + ((off) & (CD_TENSOR_WINDOW - 1)))

/* What a TensorImpl's first word (its vtable) and symbolic-flags byte say of
 * it: CD_TENSOR_OK for a plain tensor, whose fields cfg names. */
FUNC_INLINE __u8 impl_status(const struct cd_torch_cfg *cfg, __u64 vtable, __u8 symbolic)
{
	if (vtable != cfg->impl_vtable)
		return CD_TENSOR_NOT_PLAIN;
	if (symbolic & cfg->symbolic_mask)
		return CD_TENSOR_SYMBOLIC;
	return CD_TENSOR_OK;
}

/* Which of cfg's process-group classes the object at `self` is (by its
 * vtable); -1: none of them, or unreadable. */
FUNC_INLINE int group_of(const struct cd_torch_cfg *cfg, __u64 self)
{
	__u64 vt = 0;
	int grp = -1;

	if (bpf_probe_read_user(&vt, sizeof(vt), (void *)self))
		return -1;
	for (__u32 g = 0; g < CD_TORCH_GROUPS; g++)
		if (cfg->groups[g].vtable && cfg->groups[g].vtable == vt)
			grp = g;
	return grp;
}

/* The TensorImpl at `impl` into t[idx].  Global: verified once, not once
 * per tensor of each caller's paths. */
FUNC_GLOBAL int read_tensor(struct record_buf *b, const struct cd_torch_cfg *cfg, __u64 impl, __u32 idx)
{
	struct cd_tensor *t;
	__u64 dims, at;
	__u32 span, n;

	if (!b || !cfg)
		return 0;
	t = &record_tensors(b)->t[idx & (CD_MAX_TENSORS - 1)];
	__builtin_memset(t->sizes, 0, sizeof(t->sizes));
	t->numel = 0;
	t->dtype = 0;
	t->ndim = 0;
	t->status = CD_TENSOR_FAULT;
	if (impl == cfg->undefined) {
		t->status = CD_TENSOR_UNDEFINED;
		return 0;
	}
	span = cfg->span;
	if (span < 8 || span > CD_TENSOR_WINDOW)
		return 0;
	if (bpf_probe_read_user(b->impl, span, (void *)impl))
		return 0;
	t->status = impl_status(cfg, *(__u64 *)b->impl, *IMPL_AT(b, cfg->symbolic_at));
	if (t->status != CD_TENSOR_OK)
		return 0;
	t->status = CD_TENSOR_FAULT;
	dims = *(__u64 *)IMPL_AT(b, cfg->dim);
	t->ndim = dims > 255 ? 255 : (__u8)dims;
	n = dims > CD_TENSOR_DIMS ? CD_TENSOR_DIMS : (__u32)dims;
	if (dims <= cfg->inline_dims) {
		/* inline: already in the window (span covers them) */
		__builtin_memcpy(t->sizes, IMPL_AT(b, cfg->sizes), sizeof(t->sizes));
	} else {
		at = *(__u64 *)IMPL_AT(b, cfg->sizes);
		if (n == 0 || n > CD_TENSOR_DIMS || bpf_probe_read_user(t->sizes, n * sizeof(__s64), (void *)at))
			return 0;
	}
	t->numel = *(__s64 *)IMPL_AT(b, cfg->numel);
	t->dtype = *(__u16 *)IMPL_AT(b, cfg->data_type);
	t->status = CD_TENSOR_OK;
	return 0;
}

/* The TensorImpl pointers one parameter holds, up to `room` of them into
 * ptrs; the count it holds into *total.  False: unreadable. */
FUNC_INLINE bool param_impls(__u32 kind, __u64 p, __u64 *ptrs, __u32 room, __u16 *total, __u8 *flags)
{
	__u64 v[2] = {};
	__u64 n;

	*total = 0;
	if (!p)
		return false;
	if (kind == CD_TPARAM_TENSOR) {
		*total = 1;
		return bpf_probe_read_user(ptrs, sizeof(__u64), (void *)p) == 0;
	}
	if (bpf_probe_read_user(v, sizeof(v), (void *)p))
		return false;
	if (kind == CD_TPARAM_VECTOR_VECTOR) {
		/* a std::vector<at::Tensor> is 3 words */
		if (v[1] < v[0] || (v[1] - v[0]) % 24)
			return false;
		if (v[1] == v[0])
			return true;
		if (v[1] - v[0] > 24)
			*flags |= CD_TENSORS_MORE_LISTS;
		if (bpf_probe_read_user(v, sizeof(v), (void *)v[0]))
			return false;
	}
	if (v[1] < v[0] || (v[1] - v[0]) % 8)
		return false;
	n = (v[1] - v[0]) / 8;
	*total = n > 0xffff ? 0xffff : (__u16)n;
	if (n > room)
		n = room;
	if (n == 0 || n > CD_MAX_TENSORS)
		return true;
	return bpf_probe_read_user(ptrs, n * sizeof(__u64), (void *)v[0]) == 0;
}

/* The record's tensors and group into b (record_tensors), for a method
 * whose parameters are `p0`, `p1` (slots 2, 3) on object `self` (slot 1);
 * the kinds are the cookie's.  Returns the block's size. */
FUNC_GLOBAL __u32 fill_tensors(struct record_buf *b, const struct cd_torch_cfg *cfg, __u64 self, __u64 p0,
			       __u64 p1)
{
	struct cd_tensors *tn;
	__u64 ptrs[CD_MAX_TENSORS];
	__s32 v = 0;
	__u32 g, i, kind, room, filled = 0;
	int grp;

	if (!b || !cfg)
		return 0;
	tn = record_tensors(b);
	tn->group_rank = -1;
	tn->group_size = -1;
	tn->ntensors = 0;
	tn->flags = 0;
	tn->total[0] = 0;
	tn->total[1] = 0;
	tn->status = CD_TENSORS_FAULT;
	grp = group_of(cfg, self);
	if (grp < 0) {
		tn->status = CD_TENSORS_NOT_A_GROUP;
		return sizeof(*tn);
	}
	g = grp & (CD_TORCH_GROUPS - 1);
	if (cfg->groups[g].rank != CD_TORCH_NO_OFFSET &&
	    bpf_probe_read_user(&v, sizeof(v), (void *)(self + cfg->groups[g].rank)) == 0)
		tn->group_rank = v;
	if (cfg->groups[g].size != CD_TORCH_NO_OFFSET &&
	    bpf_probe_read_user(&v, sizeof(v), (void *)(self + cfg->groups[g].size)) == 0)
		tn->group_size = v;
	for (i = 0; i < 2; i++) {
		__u16 total = 0;
		__u32 j, n;

		kind = CD_TENSOR_PARAM(tn->kinds, i);
		if (kind == CD_TPARAM_NONE)
			continue;
		/* the first parameter leaves room for the second's first tensors */
		room = CD_MAX_TENSORS - filled;
		if (i == 0 && CD_TENSOR_PARAM(tn->kinds, 1) != CD_TPARAM_NONE)
			room = CD_MAX_TENSORS / 2;
		if (!param_impls(kind, i ? p1 : p0, ptrs, room, &total, &tn->flags))
			return sizeof(*tn);
		tn->total[i & 1] = total;
		n = total < room ? total : room;
		for (j = 0; j < CD_MAX_TENSORS; j++) {
			if (j >= n || filled >= CD_MAX_TENSORS)
				break;
			read_tensor(b, cfg, ptrs[j], filled);
			tn->t[filled & (CD_MAX_TENSORS - 1)].param = i;
			filled++;
		}
	}
	tn->ntensors = filled;
	tn->status = CD_TENSORS_OK;
	return sizeof(*tn);
}

/* The first TensorImpl* a parameter of `kind` at `p` holds; 0: none. */
FUNC_INLINE __u64 first_impl(__u32 kind, __u64 p)
{
	__u64 v[2] = {}, impl = 0;

	if (!p)
		return 0;
	if (kind != CD_TPARAM_TENSOR) {
		if (bpf_probe_read_user(v, sizeof(v), (void *)p) || v[1] <= v[0])
			return 0;
		/* a std::vector<std::vector<at::Tensor>>: its first inner vector's */
		if (kind == CD_TPARAM_VECTOR_VECTOR &&
		    (bpf_probe_read_user(v, sizeof(v), (void *)v[0]) || v[1] <= v[0]))
			return 0;
		p = v[0];
	}
	if (bpf_probe_read_user(&impl, sizeof(impl), (void *)p))
		return 0;
	return impl;
}

/* A c10d method's reduce op: the RedOpType in the c10d::ReduceOp its
 * options argument (the cookie's reduction-op slot) holds first, where the
 * options' first word is one of ReduceOp's vtables (cd_torch_cfg); CD_FLIGHT_NONE
 * otherwise. */
FUNC_INLINE __u32 c10d_reduce_op(const struct entry *en, const struct cd_torch_cfg *cfg)
{
	__u64 opts, vt = 0;
	__u8 op = 0;
	int i, known = 0;

	if (CD_COOKIE_REDOP(en->cookie) >= CD_NUM_ARGS || !cfg->reduce_ops[0])
		return CD_FLIGHT_NONE;
	opts = slot_arg(en->args, CD_COOKIE_REDOP(en->cookie));
	if (bpf_probe_read_user(&vt, sizeof(vt), (void *)opts) || !vt)
		return CD_FLIGHT_NONE;
	for (i = 0; i < CD_TORCH_REDUCE_OPS; i++)
		known |= cfg->reduce_ops[i] == vt;
	if (!known || bpf_probe_read_user(&op, sizeof(op), (void *)(opts + cfg->reduce_op_at)))
		return CD_FLIGHT_NONE;
	return op;
}

/* A c10d method's root: rootRank in the options its root slot holds, at
 * the offset cfg gives for a ReduceOptions (the options' reduce op was read,
 * so they open with a ReduceOp) or else a BroadcastOptions; CD_FLIGHT_NONE
 * where unknown. */
FUNC_INLINE __u32 c10d_root(const struct entry *en, const struct cd_torch_cfg *cfg, __u32 op)
{
	__u16 at = CD_COOKIE_REDOP(en->cookie) < CD_NUM_ARGS ? cfg->reduce_root_at : cfg->broadcast_root_at;
	__u32 root = 0;

	if (CD_COOKIE_PEER(en->cookie) >= CD_NUM_ARGS || at == CD_TORCH_NO_OFFSET ||
	    (CD_COOKIE_REDOP(en->cookie) < CD_NUM_ARGS && op == CD_FLIGHT_NONE))
		return CD_FLIGHT_NONE;
	if (bpf_probe_read_user(&root, sizeof(root), (void *)(slot_arg(en->args, CD_COOKIE_PEER(en->cookie)) + at)))
		return CD_FLIGHT_NONE;
	return root;
}

/* The flight recorder's count, datatype, reduce op and root of a c10d collective
 * (events.h, cd_flight_entry): the elements and TypeMeta index of the first
 * tensor of its first tensor parameter, read as fill_tensors reads it
 * (group_of, impl_status), from `this` in slot 1 and that parameter in slot
 * 2, and c10d_reduce_op's and c10d_root's; left unknown where the process has no
 * cd_torch_cfg yet or anything is not as userspace said.  Global: verified
 * once. */
FUNC_GLOBAL int c10d_first(const struct entry *en, struct flight_sig *sig)
{
	const struct cd_torch_cfg *cfg;
	__u64 impl, vt = 0, numel = 0;
	__u16 dtype = 0;
	__u8 sym = 0;
	__u32 kind;

	if (!en || !sig)
		return 0;
	sig->count = CD_FLIGHT_NO_COUNT;
	sig->dtype = CD_DTYPE_NONE;
	cfg = torch_cfg_for(en->cookie, en->tgid);
	if (!cfg)
		return 0;
	sig->op = c10d_reduce_op(en, cfg);
	sig->root = c10d_root(en, cfg, sig->op);
	kind = CD_TENSOR_PARAM(CD_COOKIE_TENSORS(en->cookie), 0);
	if (kind == CD_TPARAM_NONE || group_of(cfg, slot_arg(en->args, CD_TENSOR_THIS_SLOT)) < 0)
		return 0;
	impl = first_impl(kind, slot_arg(en->args, CD_TENSOR_FIRST_SLOT));
	if (!impl || impl == cfg->undefined || bpf_probe_read_user(&vt, sizeof(vt), (void *)impl) ||
	    bpf_probe_read_user(&sym, sizeof(sym), (void *)(impl + cfg->symbolic_at)) ||
	    impl_status(cfg, vt, sym) != CD_TENSOR_OK ||
	    bpf_probe_read_user(&numel, sizeof(numel), (void *)(impl + cfg->numel)) ||
	    bpf_probe_read_user(&dtype, sizeof(dtype), (void *)(impl + cfg->data_type)))
		return 0;
	sig->count = numel;
	sig->dtype = CD_FLIGHT_TORCH_DTYPE | dtype;
	return 1;
}

#endif /* COMMDBG_TORCH_TENSORS_H */
