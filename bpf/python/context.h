/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A record's context tail (events.h, cd_context: its label and Python
 * stack), built in the thread's record_buf behind the record's body and
 * sent with it in one bpf_ringbuf_output.
 */
#ifndef COMMDBG_PYTHON_CONTEXT_H
#define COMMDBG_PYTHON_CONTEXT_H

#include "lib/batch.h"
#include "lib/drops.h"
#include "lib/lookup_or_init.h"
#include "lib/records.h"
#include "python/label.h"
#include "python/record_buf.h"
#include "python/walk.h"
#include "torch/tensors.h"

#define CONTEXT_TAIL_MAX (sizeof(struct cd_context) + CD_MAX_PY_FRAMES * sizeof(struct cd_py_frame))

/* The label (the std::string at `label`, for a label tail) and stack of a
 * record into b; returns the tail's length.  Global: call_enter has hundreds
 * of paths that reach it. */
FUNC_GLOBAL __u32 fill_context(struct record_buf *b, __u32 tgid, __u64 cookie, __u64 label,
			       const struct cd_py_cfg *cfg)
{
	struct walk w = {.b = b, .state = 0, .cfg = cfg};
	__u32 n;

	if (!b)
		return 0;
	w.state = &b->walk;
	__builtin_memset(&b->walk, 0, sizeof(b->walk));
	b->walk.status = CD_PY_OK;

	b->context.label_len = 0;
	b->context.nframes = 0;
	b->context.flags = 0;
	b->context.py_status = CD_PY_NONE;
	if (CD_COOKIE_TAIL(cookie) == CD_TAIL_LABEL)
		read_label(b, label);
	if (cfg) {
		b->context.py_status = py_top_frame(cfg, &w);
		if (b->context.py_status == CD_PY_OK) {
			w.codes = bpf_map_lookup_elem(&py_codes, &tgid);
			if (CD_COOKIE_ROLE(cookie) == CD_ROLE_MODULE_ENTER && w.codes && !module_call_on_top(&w)) {
				b->walk.dropped = 1;
				return 0;
			}
			bpf_loop(2 * CD_MAX_PY_FRAMES / WALK_BATCH, walk_frames, &w, 0);
			if (b->walk.need_types)
				bpf_loop(CD_MAX_PY_FRAMES, read_type, &w, 0);
			b->context.py_status = b->walk.status;
			b->context.flags |= b->walk.flags;
		}
	}
	n = b->walk.nframes > CD_MAX_PY_FRAMES ? CD_MAX_PY_FRAMES : b->walk.nframes;
	b->context.nframes = n;
	if (cfg && cfg->rf_type && !b->context.label_len && CD_COOKIE_ROLE(cookie) == CD_ROLE_SCOPE_BEGIN)
		read_py_label(b, cfg, n);
	return sizeof(struct cd_context) + n * sizeof(struct cd_py_frame);
}

/* fill_context for a record with these args; its length, to be checked
 * against CONTEXT_TAIL_MAX: the verifier, unlike clang, cannot see the
 * bound of a global function's result (barrier_var keeps clang's check). */
FUNC_INLINE __u32 context_tail(struct record_buf *b, __u32 tgid, __u64 cookie, const __u64 *args,
			       const struct cd_py_cfg *cfg)
{
	__u32 tail = fill_context(b, tgid, cookie, slot_arg(args, CD_COOKIE_OUT(cookie)), cfg);

	barrier_var(tail);
	return tail;
}

/* The per-thread buffer a record with context is built in; 0 when the
 * record needs none (`tensors`: it carries a cd_tensors). */
FUNC_INLINE struct record_buf *context_buf(__u64 cookie, __u32 tgid, __u32 tid, __u32 flags,
					   const struct cd_py_cfg **cfg, bool tensors)
{
	struct record_buf *b;

	*cfg = py_cfg_for(cookie, tgid, flags);
	if (!*cfg && CD_COOKIE_TAIL(cookie) != CD_TAIL_LABEL && !tensors)
		return 0;
	b = lookup_or_init(&record_bufs, &tid, &record_buf_zero);
	if (!b)
		count_drop(CD_DROP_PY_CONTEXT); /* sent without it */
	return b;
}

/* Names of a record's Python frames are read from the live process when
 * userspace takes the record: a record with context wakes it unless one did
 * less than CD_CONTEXT_WAKE_NS ago (a wake-up per 5 ms at most, not one per
 * record); userspace reads again that long after a wake-up by itself, so
 * the records in between are named within ~5 ms too (TraceSession::poll).
 * A scope's begin wakes it at once while userspace has yet to learn where
 * torch 1.13 keeps labels.  `now`: the record's own time, read once for both. */
__u64 context_woken_ns = 0;

FUNC_INLINE __u64 context_wakeup(__u64 wakeup, __u64 cookie, const struct cd_py_cfg *cfg, __u64 now)
{
	if (wakeup == BPF_RB_FORCE_WAKEUP)
		return wakeup;
	if (cfg && !cfg->rf_type && CD_COOKIE_ROLE(cookie) == CD_ROLE_SCOPE_BEGIN)
		return BPF_RB_FORCE_WAKEUP;
	if (now - context_woken_ns < CD_CONTEXT_WAKE_NS)
		return wakeup;
	context_woken_ns = now;
	return BPF_RB_FORCE_WAKEUP;
}

/* An entry record's body starts here, right-aligned before the context, or
 * before its tensors. */
#define ENTER_BODY_OFF (RECORD_HEAD_MAX - sizeof(struct cd_call_enter))
#define ENTER_TENSORS_BODY_OFF (TENSORS_OFF - sizeof(struct cd_call_enter))

/* The tensors of a c10d method's record into b; their size, 0 for none. */
FUNC_INLINE __u32 tensors_part(struct record_buf *b, const struct entry *en, const struct cd_torch_cfg *tcfg)
{
	__u32 len;

	if (!tcfg)
		return 0;
	record_tensors(b)->kinds = CD_COOKIE_TENSORS(en->cookie);
	len = fill_tensors(b, tcfg, en->args[CD_TENSOR_THIS_SLOT], en->args[CD_TENSOR_FIRST_SLOT],
			   en->args[CD_TENSOR_FIRST_SLOT + 1]);
	barrier_var(len);
	return len == sizeof(struct cd_tensors) ? len : 0;
}

/* An entry record with its context; false when it has none to carry. */
FUNC_INLINE bool emit_enter_with_context(const struct entry *en, __u64 wakeup)
{
	const struct cd_py_cfg *cfg;
	const struct cd_torch_cfg *tcfg = torch_cfg_for(en->cookie, en->tgid);
	struct record_buf *b = context_buf(en->cookie, en->tgid, en->tid, en->flags, &cfg, tcfg != 0);
	__u32 tail, tensors;
	__u8 *body;

	if (!b)
		return false;
	tensors = tensors_part(b, en, tcfg);
	tail = context_tail(b, en->tgid, en->cookie, en->args, cfg);
	if (b->walk.dropped)
		return true; /* handled: nothing to send */
	if (tail > CONTEXT_TAIL_MAX)
		return false;
	body = b->head + (tensors ? ENTER_TENSORS_BODY_OFF : ENTER_BODY_OFF);
	fill_enter((struct cd_call_enter *)body, en, tensors + tail, tensors ? CD_TAIL_TENSORS : CD_TAIL_CONTEXT);
	wakeup = context_wakeup(wakeup, en->cookie, cfg, en->ts);
	if (bpf_ringbuf_output(&events, body, sizeof(struct cd_call_enter) + tensors + tail, wakeup))
		count_ringbuf_drop(en->tgid);
	return true;
}

/* A call record with its context, built at the return: the Python stack
 * of a thread inside a native call is the one it had at the entry. */
FUNC_INLINE bool emit_call_with_context(const struct cd_inflight *call, struct cd_thread *st, __u32 tid,
					const struct ret_info *r)
{
	const struct cd_py_cfg *cfg;
	struct record_buf *b = context_buf(call->cookie, call->ckey.tgid, tid, call->flags, &cfg, false);
	__u64 wakeup;
	__u8 *body;
	__u32 tail;

	if (!b)
		return false;
	wakeup = call_wakeup(st);
	batch_before(st);
	tail = context_tail(b, call->ckey.tgid, call->cookie, call->args, cfg);
	if (tail > CONTEXT_TAIL_MAX)
		return false;
	body = b->head + RECORD_HEAD_MAX - RECORD_BODY_MAX;
	fill_call((struct cd_call *)body, call, tid, r, tail);
	wakeup = context_wakeup(wakeup, call->cookie, cfg, ((struct cd_call *)body)->h.ts_ns);
	if (bpf_ringbuf_output(&events, body, sizeof(struct cd_call) + tail, wakeup))
		count_ringbuf_drop(call->ckey.tgid);
	return true;
}

#endif /* COMMDBG_PYTHON_CONTEXT_H */
