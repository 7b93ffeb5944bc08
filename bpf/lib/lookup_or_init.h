/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Map values too large for the 512-byte BPF stack (a thread's state, a
 * process's counters, a record buffer) are created from a zeroed template
 * kept in a one-entry per-CPU array next to their map. */
#ifndef COMMDBG_LIB_LOOKUP_OR_INIT_H
#define COMMDBG_LIB_LOOKUP_OR_INIT_H

#include "lib/compiler.h"

/* The value of `key` in `map`, created from the zeroed template in the
 * one-entry array `zero_map` when missing.  BPF_NOEXIST: a racing creator
 * on another CPU wins, and the lookup after it returns that one. */
FUNC_INLINE void *lookup_or_init(void *map, const void *key, void *zero_map)
{
	void *v = bpf_map_lookup_elem(map, key);
	__u32 zero = 0;

	if (v)
		return v;
	v = bpf_map_lookup_elem(zero_map, &zero);
	if (!v)
		return 0;
	bpf_map_update_elem(map, key, v, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

#endif /* COMMDBG_LIB_LOOKUP_OR_INIT_H */
