/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The per-thread buffer a record with context (a label, a Python stack) is
 * built in and copied out of with bpf_ringbuf_output, at its real size: a
 * reservation has a constant size, and reserving the largest stack for
 * every record would fill the ring buffer with empty frames.  Per thread
 * (key: tid), not per CPU: uprobe programs can be preempted, the thread is
 * the only writer.  The Python walk keeps its progress and its copies of
 * the target's memory here too.
 */
#ifndef COMMDBG_PYTHON_RECORD_BUF_H
#define COMMDBG_PYTHON_RECORD_BUF_H

#include "lib/compiler.h"
#include "events.h"

/* Room for the largest record body (cd_call) and a record's tensors
 * (torch/tensors.h), right-aligned before the context so that body and tail
 * are contiguous whatever its kind: [body][context][frames], or
 * [body][tensors][context][frames]. */
#define RECORD_BODY_MAX sizeof(struct cd_call)
#define RECORD_HEAD_MAX (RECORD_BODY_MAX + sizeof(struct cd_tensors))
#define TENSORS_OFF (RECORD_HEAD_MAX - sizeof(struct cd_tensors))
#define PY_FRAME_WINDOW CD_PY_FRAME_WINDOW /* every field but 3.10's localsplus */
/* A frame's field is loaded at (offset & (PY_FRAME_WINDOW - 1)) past the
 * frame's start in a copy: 8 bytes past the window's end stay in bounds. */
#define WINDOW_SLACK (PY_FRAME_WINDOW + 8)
/* Bytes of a 3.11+ data stack copied in one read: the innermost ~40 frames
 * of a torch job, more of smaller ones.  Frames below the copy refill it. */
#define PY_STACK_COPY 8192

/* A Python walk's progress (python/walk.h), kept in the buffer rather than
 * on the stack: the verifier does not track values here, and on the stack
 * each frame's known constants made states it could not prune. */
struct walk_state {
	__u64 frame;	    /* the next frame to walk */
	__u64 chunk, limit; /* the data stack chunk the copy is from; 0: none */
	__u64 copy_base;    /* user address of stack_copy[0] */
	__u32 copy_len;	    /* bytes valid in stack_copy */
	__u32 nframes;	    /* frames kept in record_buf.frames */
	__u32 status;	    /* CD_PY_* */
	__u32 flags;	    /* CD_CTX_* */
	__u32 n_in_backward; /* frames [0, n_in_backward) may run inside the autograd engine */
	__u32 need_types;    /* some frame's `self` needs its type read */
	__u32 dropped;	     /* the record is not worth sending (walk.h, module_call_on_top) */
};

struct record_buf {
	struct walk_state walk;
	__u8 head[RECORD_HEAD_MAX];
	struct cd_context context;
	struct cd_py_frame frames[CD_MAX_PY_FRAMES];
	__u8 kinds[CD_MAX_PY_FRAMES]; /* enum cd_py_code_kind per frame, during the walk */
	__u8 stack_copy[PY_STACK_COPY + WINDOW_SLACK];
	__u8 window[CD_PY_TS_WINDOW + WINDOW_SLACK]; /* the thread state, then a frame outside the copy */
	__u8 impl[CD_TENSOR_WINDOW + 8 * CD_TENSOR_DIMS]; /* a TensorImpl's fields, then room for its inline sizes (torch/tensors.h) */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct record_buf);
} record_bufs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct record_buf);
} record_buf_zero SEC(".maps");

#endif /* COMMDBG_PYTHON_RECORD_BUF_H */
