/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* torch's USER_SCOPE RecordFunctions open in the kernel's view, from the
 * begin to the first end (events.h, cd_scope_key): while one is, userspace
 * may read its label from the live record_function object. */
#ifndef COMMDBG_LIB_SCOPES_H
#define COMMDBG_LIB_SCOPES_H

#include "lib/entry.h"

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cd_scope_key);
	__type(value, __u64);
} open_scopes SEC(".maps");

/* The scope is a uint8_t: the register's low byte. */
#define CD_USER_SCOPE 7

/* Whether a scope marker is worth a record, keeping open_scopes.  A begin
 * only of a USER_SCOPE: torch constructs a RecordFunction of its own at
 * every RECORD_FUNCTION site (around each autograd node, ...), callbacks or
 * not, and those open no scope.  An end only of a scope open in this view:
 * end() also runs for every one of torch's own, and again from the
 * destructor of a user scope already ended.  Dropped here, they cost a trap
 * and a helper call, not a record, a Python stack and userspace's reading. */
FUNC_INLINE bool track_scope(const struct entry *en)
{
	struct cd_scope_key k = {.tgid = en->tgid, .self = slot_arg(en->args, CD_COOKIE_COUNT(en->cookie))};

	if (en->role == CD_ROLE_SCOPE_BEGIN) {
		if ((slot_arg(en->args, CD_COOKIE_PEER(en->cookie)) & 0xff) != CD_USER_SCOPE)
			return false;
		bpf_map_update_elem(&open_scopes, &k, &en->ts, BPF_ANY);
	} else if (en->role == CD_ROLE_SCOPE_END) {
		/* torch >= 2's record_function exit names no RecordFunction:
		 * only user scopes reach it, and userspace closes the
		 * thread's innermost scope a label opened. */
		if (CD_COOKIE_COUNT(en->cookie) == CD_SLOT_NONE)
			return true;
		return bpf_map_delete_elem(&open_scopes, &k) == 0;
	}
	return true;
}

#endif /* COMMDBG_LIB_SCOPES_H */
