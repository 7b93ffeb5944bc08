/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A thread's Python stack, walked from its innermost frame: per frame the
 * code object, the instruction and the first local (`self`), and that
 * `self`'s type where the code's kind asks for it.  Names and line numbers
 * are userspace's, from the code objects.  Every layout offset comes from
 * userspace (events.h, cd_py_cfg; userspace/python/py_config.cpp).
 */
#ifndef COMMDBG_PYTHON_WALK_H
#define COMMDBG_PYTHON_WALK_H

#include "python/record_buf.h"
#include "arch_x86.h"

/* tgid -> how to walk its Python frames (events.h), set by userspace for
 * traced processes that run CPython. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct cd_py_cfg);
} py_procs SEC(".maps");

/* tgid -> its code objects' kinds (events.h, cd_py_codes), from userspace
 * as it names frames; a process without one reads every frame's type. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cd_py_codes);
} py_codes SEC(".maps");

/* The Python stack is walked only where the symbol asks for it and the
 * process runs a CPython userspace found a layout for. */
FUNC_INLINE const struct cd_py_cfg *py_cfg_for(__u64 cookie, __u32 tgid, __u32 flags)
{
	/* the flag first: a process without Python pays no lookup */
	return (flags & CD_TRACE_PYTHON) && CD_COOKIE_PY_STACK(cookie) ? bpf_map_lookup_elem(&py_procs, &tgid) : 0;
}

FUNC_INLINE __u64 read_u64(__u64 addr)
{
	__u64 v = 0;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		return 0;
	return v;
}

/* 8 bytes at `off` of a frame copied to `p` (record_buf.stack_copy or
 * .window, each followed by WINDOW_SLACK bytes); userspace keeps offsets
 * under PY_FRAME_WINDOW (py_config.cpp). */
FUNC_INLINE __u64 frame_u64(const __u8 *p, __u32 off)
{
	return *(const __u64 *)(p + (off & (PY_FRAME_WINDOW - 1)));
}

/* 8 bytes at `off` of the thread state copied to record_buf.window. */
FUNC_INLINE __u64 tstate_u64(const struct record_buf *b, __u32 off)
{
	if (off >= CD_PY_TS_WINDOW)
		return 0;
	return *(const __u64 *)(b->window + off);
}

/* A walk's pointers, on the stack; its progress is in the buffer. */
struct walk {
	struct record_buf *b;
	struct walk_state *state; /* &b->walk */
	const struct cd_py_cfg *cfg;
	const struct cd_py_codes *codes; /* 0: every code object is unknown */
};

/* stack_copy = the PY_STACK_COPY bytes of the data stack below `hi` (not
 * below the chunk): the frames there in one read, the outer ones at lower
 * addresses. */
FUNC_INLINE void copy_stack(struct walk *w, __u64 hi)
{
	__u64 lo = hi - w->state->chunk > PY_STACK_COPY ? hi - PY_STACK_COPY : w->state->chunk, len = hi - lo;

	w->state->copy_len = 0;
	if (len == 0 || len > PY_STACK_COPY)
		return;
	if (bpf_probe_read_user(w->b->stack_copy, len, (void *)lo))
		return;
	w->state->copy_base = lo;
	w->state->copy_len = len;
}

/* The thread's innermost Python frame, through its thread state in the
 * interpreter's autoTSSkey slot: the GIL is usually released at a native
 * probe, so "the thread holding the GIL" would be another thread.  On
 * 3.11+ the top of the thread's data stack is copied as well. */
FUNC_INLINE __u32 py_top_frame(const struct cd_py_cfg *c, struct walk *w)
{
	struct record_buf *b = w->b;
	__u64 fs = cd_thread_pointer(), ts, f, top;
	__u32 span = c->ts_span;

	ts = read_u64(fs + c->tls_base + (__u64)c->tls_stride * c->key + c->tls_data);
	if (!ts || span == 0 || span > CD_PY_TS_WINDOW ||
	    bpf_probe_read_user(b->window, span, (void *)(ts + c->ts_lo)))
		return CD_PY_NO_TSTATE;
	if (tstate_u64(b, c->ts_thread_id - c->ts_lo) != fs)
		return CD_PY_NO_TSTATE; /* no Python on this thread, or another thread's state */
	f = tstate_u64(b, c->ts_frame - c->ts_lo);
	if (c->ts_stack != 0xffffffffu) {
		w->state->chunk = tstate_u64(b, c->ts_stack - c->ts_lo);
		top = tstate_u64(b, c->ts_stack + 8 - c->ts_lo);
		w->state->limit = tstate_u64(b, c->ts_stack + 16 - c->ts_lo);
		/* The copy is the target's memory, whatever these say: a wrong
		 * bound costs reads, never a wrong frame. */
		if (w->state->chunk && w->state->chunk < top && top <= w->state->limit)
			copy_stack(w, top + PY_FRAME_WINDOW < w->state->limit ? top + PY_FRAME_WINDOW
									: w->state->limit);
		else
			w->state->chunk = 0;
	}
	if (f && c->ts_frame_inner != 0xffffffffu)
		f = read_u64(f + c->ts_frame_inner);
	w->state->frame = f;
	return CD_PY_OK;
}

/* The kind userspace gave `code`'s slot, with direct loads: no helper. */
FUNC_INLINE __u32 code_kind(const struct cd_py_codes *t, __u64 code)
{
	return t ? cd_py_code_lookup(t, code) : CD_CODE_UNKNOWN;
}

/* Where the frame's fields are: in the data stack's copy (refilled when
 * the frame is below it), else read into the window; 0 when unreadable. */
FUNC_INLINE const __u8 *frame_at(struct walk *w, __u64 frame, __u32 span)
{
	struct record_buf *b = w->b;
	__u64 rel = frame - w->state->copy_base;

	if (w->state->chunk && frame >= w->state->chunk && frame + span <= w->state->limit &&
	    (frame < w->state->copy_base || rel + span > w->state->copy_len))
		copy_stack(w, frame + span);
	rel = frame - w->state->copy_base;
	if (w->state->copy_len && frame >= w->state->copy_base && rel + span <= w->state->copy_len &&
	    rel < PY_STACK_COPY)
		return b->stack_copy + rel;
	/* One read per frame; a shorter one where a frame ends a mapping. */
	if (bpf_probe_read_user(b->window, PY_FRAME_WINDOW, (void *)frame) &&
	    bpf_probe_read_user(b->window, PY_FRAME_WINDOW / 2 + 16, (void *)frame))
		return 0;
	return b->window;
}

/* One frame; C-stack trampolines are skipped.  Per frame: the code object,
 * the instruction, localsplus[0] and the code's kind; `self`'s type waits
 * for the whole stack (read_type).  1: the walk is over. */
FUNC_INLINE long walk_one(struct walk *w)
{
	struct record_buf *b = w->b;
	const struct cd_py_cfg *c = w->cfg;
	__u64 frame, code, self;
	const __u8 *fp;
	struct cd_py_frame *f;
	__u32 n, owner, instr, ls, kind;

	frame = w->state->frame;
	n = w->state->nframes;
	owner = c->frame_owner;
	instr = c->frame_instr;
	ls = c->frame_localsplus;
	if (!frame)
		return 1;
	if (n >= c->max_frames || n >= CD_MAX_PY_FRAMES) {
		w->state->flags |= CD_CTX_TRUNCATED;
		return 1;
	}
	fp = frame_at(w, frame, c->frame_span > PY_FRAME_WINDOW ? PY_FRAME_WINDOW : c->frame_span);
	if (!fp) {
		w->state->status = CD_PY_FAULT;
		return 1;
	}
	code = frame_u64(fp, c->frame_code);
	w->state->frame = frame_u64(fp, c->frame_previous);
	if (owner < PY_FRAME_WINDOW && fp[owner & (PY_FRAME_WINDOW - 1)] == c->frame_owner_cstack)
		return 0;
	if (!code || ((c->flags & CD_PYCFG_SKIP_NONE_CODE) && code == c->none_addr))
		return 0;
	f = &b->frames[n & (CD_MAX_PY_FRAMES - 1)];
	f->code = code;
	if (c->flags & CD_PYCFG_LASTI_INT)
		f->instr = instr < PY_FRAME_WINDOW - 4 ? *(const __s32 *)(fp + (instr & (PY_FRAME_WINDOW - 1))) : 0;
	else
		f->instr = frame_u64(fp, instr);
	self = ls <= PY_FRAME_WINDOW - 8 ? frame_u64(fp, ls) : read_u64(frame + ls);
	f->self = self;
	f->self_type = 0;
	kind = code_kind(w->codes, code);
	b->kinds[n & (CD_MAX_PY_FRAMES - 1)] = kind;
	if (kind == CD_CODE_UNKNOWN || kind == CD_CODE_BACKWARD) {
		w->state->n_in_backward = n; /* the frames inside it may run on behalf of gradients */
		if (n)
			w->state->need_types = 1;
	}
	if (kind == CD_CODE_UNKNOWN || kind == CD_CODE_SELF)
		w->state->need_types = 1;
	w->state->nframes = n + 1;
	return 0;
}

/* WALK_BATCH frames per call, or `max` when fewer; 1: the walk is over.
 * The frames are unrolled here and their calls made from a bpf_loop
 * callback: on this kind of CPU every return of a BPF function is a
 * deliberately mispredicted one (the SRSO "safe RET" mitigation), ~15 ns,
 * as much as the rest of a frame's walk, so fewer calls per frame is most
 * of what a walk can save.  Global, so verified once: since Linux 6.7 the
 * verifier checks a bpf_loop callback again and again until its states
 * converge, and these bodies inlined into the callback made most of
 * call_enter's verified instructions (tests/e2e/test_bpf_load.cpp).
 * bench/bench_probe.cpp prints the load time and each program's verified
 * instructions, to measure before changing WALK_BATCH. */
#define WALK_BATCH 8

FUNC_GLOBAL long walk_batch(struct record_buf *b, const struct cd_py_cfg *c, const struct cd_py_codes *codes,
			    __u32 max)
{
	struct walk wk = {.b = b, .state = 0, .cfg = c, .codes = codes};

	if (!b || !c)
		return 1;
	wk.state = &b->walk;
#pragma unroll
	for (int k = 0; k < WALK_BATCH; k++)
		if (k >= max || walk_one(&wk))
			return 1;
	return 0;
}

/* Whether a module-entry event (torch::jit::tracer::getTracingState) can
 * be an nn.Module call's: its innermost frame is _call_impl, a code object
 * userspace classed CD_CODE_SELF.  torch's Python bindings call
 * getTracingState too, at every op they dispatch (on a DTensor job ~15 per
 * module call): those frames are classed otherwise once named, and their
 * events open no module, so they go unsent -- no walk, no record.  A frame
 * not named yet, or none walked, passes: userspace decides, and learns.
 * Walks the innermost frame; the rest of the walk goes on from there. */
FUNC_INLINE bool module_call_on_top(struct walk *w)
{
	__u32 kind;

	walk_batch(w->b, w->cfg, w->codes, 1);
	if (w->state->nframes == 0)
		return true;
	kind = w->b->kinds[0];
	return kind == CD_CODE_UNKNOWN || kind == CD_CODE_SELF;
}

FUNC_CALLBACK long walk_frames(__u64 i, void *data)
{
	struct walk *w = data;

	return walk_batch(w->b, w->cfg, w->codes, WALK_BATCH) ? 1 : 0;
}

/* `self`'s type, read now (the instance may die before userspace looks;
 * types live long), a cell's contents when a closure captured it.
 * Userspace decides from the code object whether the slot is really a
 * first argument. */
FUNC_CALLBACK long read_type(__u64 i, void *data)
{
	struct walk *w = data;
	const struct cd_py_cfg *c = w->cfg;
	struct cd_py_frame *f;
	__u64 self, type = 0;
	__u32 kind;

	if (i >= w->state->nframes || i >= CD_MAX_PY_FRAMES)
		return 1;
	kind = w->b->kinds[i & (CD_MAX_PY_FRAMES - 1)];
	if (kind == CD_CODE_NO_ARGS || kind == CD_CODE_BACKWARD ||
	    (kind == CD_CODE_PLAIN && i >= w->state->n_in_backward))
		return 0;
	f = &w->b->frames[i & (CD_MAX_PY_FRAMES - 1)];
	self = f->self;
	if (self)
		type = read_u64(self + c->ob_type);
	if (type && type == c->cell_type) {
		self = read_u64(self + c->cell_contents);
		type = self ? read_u64(self + c->ob_type) : 0;
	}
	f->self = self;
	f->self_type = type;
	return 0;
}

#endif /* COMMDBG_PYTHON_WALK_H */
