/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A C++ std::string read from the traced process: libstdc++'s layout (the
 * data pointer at +0, the length at +8; Debian's and torch's wheels alike,
 * both built with the C++11 ABI).  Labels and c10d store prefixes use it.
 */
#ifndef COMMDBG_LIB_CXX_STRING_H
#define COMMDBG_LIB_CXX_STRING_H

#include "lib/compiler.h"

/* The data pointer and length of the std::string at `str`; false when it
 * cannot be read. */
FUNC_INLINE bool read_std_string(__u64 str, __u64 *data, __u64 *len)
{
	__u64 sv[2] = {};

	if (!str || bpf_probe_read_user(sv, sizeof(sv), (void *)str))
		return false;
	*data = sv[0];
	*len = sv[1];
	return true;
}

#endif
