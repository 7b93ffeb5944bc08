/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A record's label: a framework's name for what a call is part of, copied
 * while the call runs (the string may be freed by the time userspace reads
 * the record).  From a std::string argument, or, in torch 1.13, from the
 * record_function object on the Python stack.
 */
#ifndef COMMDBG_PYTHON_LABEL_H
#define COMMDBG_PYTHON_LABEL_H

#include "lib/cxx_string.h"
#include "python/record_buf.h"
#include "python/walk.h"

/* `size` bytes of user memory at `data` as the record's label, cut at
 * CD_LABEL_MAX (and flagged so). */
FUNC_INLINE void copy_label(struct record_buf *b, __u64 data, __u64 size)
{
	__u32 len = size > CD_LABEL_MAX ? CD_LABEL_MAX : (__u32)size;

	if (size > CD_LABEL_MAX)
		b->context.flags |= CD_CTX_LABEL_CUT;
	if (len == 0 || len > CD_LABEL_MAX)
		return;
	if (bpf_probe_read_user(b->context.label, len, (void *)data) == 0)
		b->context.label_len = len;
}

/* std::string const* -> the label. */
FUNC_INLINE void read_label(struct record_buf *b, __u64 str)
{
	__u64 data, len;

	if (read_std_string(str, &data, &len))
		copy_label(b, data, len);
}

#define CD_STR_COMPACT_ASCII 0x60 /* PyASCIIObject state: compact (bit 5) and ascii (bit 6) */

/* torch 1.13: a scope's label is the `name` of the record_function whose
 * __enter__ is on the stack (events.h, cd_py_cfg.rf_type), among the `n`
 * frames walked.  Userspace reading it later might find the object freed
 * and its address reused. */
FUNC_INLINE void read_py_label(struct record_buf *b, const struct cd_py_cfg *c, __u32 n)
{
	__u64 values, str, len = 0;
	__u32 state = 0, i;

	for (i = 0; i < CD_SCOPE_LABEL_FRAMES; i++) {
		if (i >= n)
			return;
		if (b->frames[i].self_type == c->rf_type)
			break;
	}
	if (i >= CD_SCOPE_LABEL_FRAMES)
		return;
	values = read_u64(b->frames[i].self - CD_PY311_VALUES_BEFORE);
	str = values ? read_u64(values + 8 * (__u64)c->rf_name_index) : 0;
	if (!str || bpf_probe_read_user(&len, sizeof(len), (void *)(str + c->str_length)) ||
	    bpf_probe_read_user(&state, sizeof(state), (void *)(str + c->str_state)) ||
	    (state & CD_STR_COMPACT_ASCII) != CD_STR_COMPACT_ASCII)
		return;
	copy_label(b, str + c->str_ascii_data, len);
}

#endif /* COMMDBG_PYTHON_LABEL_H */
