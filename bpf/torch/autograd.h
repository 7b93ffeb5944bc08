/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Autograd nodes (events.h, CD_ROLE_GRAD_FN / CD_ROLE_AUTOGRAD_NODE): the
 * Node* a record stands for, read while the probed call's arguments still
 * hold it.  Userspace maps each node made in forward to the modules running
 * then, and each node the engine runs in backward back to them
 * (docs/design/backward.md).
 */
#ifndef COMMDBG_TORCH_AUTOGRAD_H
#define COMMDBG_TORCH_AUTOGRAD_H

#include "lib/entry.h"

/* Records only: nothing is counted of a node. */
FUNC_INLINE void read_autograd_node(struct entry *en)
{
	__u32 slot = CD_COOKIE_COUNT(en->cookie);
	__u64 p, v = 0;

	if (en->role != CD_ROLE_GRAD_FN && en->role != CD_ROLE_AUTOGRAD_NODE)
		return;
	if (slot >= CD_REG_SLOTS)
		return;
	p = en->args[slot & 7];
	if (p && bpf_probe_read_user(&v, sizeof(v), (void *)p))
		v = 0;
	if (en->role == CD_ROLE_GRAD_FN)
		en->args[slot & 7] = v; /* the Edge's Node* */
	else
		en->args[CD_NODE_VTABLE_SLOT] = v; /* the node's vtable */
}

#endif /* COMMDBG_TORCH_AUTOGRAD_H */
