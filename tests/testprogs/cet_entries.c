// SPDX-License-Identifier: Apache-2.0
// Functions whose entries are spelled out byte for byte, for where commdbg
// puts an entry probe (EntryPlacement.* in tests/e2e/test_probe_placement.cpp):
//   cet_push  endbr64; push %rbx   (the push is emulated by the kernel)
//   cet_mov   endbr64; mov ...     (not emulated: the probe stays at +0)
//   plain     push %rbp            (no endbr64)
// Usage: cet_entries N.  Calls each N times, then prints one JSON line with
// the first 8 bytes of each function as this process sees them: a uprobe's
// int3 (0xcc) where a probe is.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

__asm__(
    ".text\n"
    ".globl cet_push\n.type cet_push,@function\ncet_push:\n"
    "  endbr64\n  push %rbx\n  lea 1(%rdi),%rax\n  pop %rbx\n  ret\n.size cet_push,.-cet_push\n"
    ".globl cet_mov\n.type cet_mov,@function\ncet_mov:\n"
    "  endbr64\n  mov %rdi,%rax\n  add $2,%rax\n  ret\n.size cet_mov,.-cet_mov\n"
    ".globl plain\n.type plain,@function\nplain:\n"
    "  push %rbp\n  lea 3(%rdi),%rax\n  pop %rbp\n  ret\n.size plain,.-plain\n");

long cet_push(long);
long cet_mov(long);
long plain(long);

static void print_bytes(const char* name, const void* fn, int last) {
    const volatile uint8_t* p = (const volatile uint8_t*)fn;
    printf("\"%s\": [", name);
    for (int i = 0; i < 8; ++i) printf("%s%u", i ? ", " : "", (unsigned)p[i]);
    printf("]%s", last ? "" : ", ");
}

int main(int argc, char** argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
    long (*volatile fns[3])(long) = {cet_push, cet_mov, plain};
    for (long i = 0; i < n; ++i)
        for (int f = 0; f < 3; ++f) sum += fns[f](i);
    printf("{\"cet_entries\": {\"calls\": %ld, \"sum\": %ld, ", n, sum);
    print_bytes("cet_push", (const void*)cet_push, 0);
    print_bytes("cet_mov", (const void*)cet_mov, 0);
    print_bytes("plain", (const void*)plain, 1);
    printf("}}\n");
    fflush(stdout);
    return 0;
}
