#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_function_length.py LIMIT FILE...: fails naming every function body (brace
matched, strings and comments skipped; methods defined in class bodies too) longer
than LIMIT lines.  The project's rule: no function in bpf/, userspace/, daemon/, cli/
over 80 lines, and BPF programs' top-level functions under 60."""
import re, sys

CTRL = re.compile(r'^\s*(if|for|while|switch|catch|else|do|try|return|case)\b|\]\s*\(|\[[^\]]*\]\s*(\(|\{)|=\s*\[')
HEAD_END = re.compile(r'\)\s*(const)?\s*(noexcept)?\s*(override)?\s*(->\s*[\w:<>,\s*&]+)?\s*\{\s*$')

def strip(src):
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i); i = n if j < 0 else j; continue
        if src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n - 2 if j < 0 else j
            seg = src[i:j + 2]; out.append('\n' * seg.count('\n')); i = j + 2; continue
        m = re.match(r'R"([^()\\\s]{0,16})\(', src[i:i + 20]) if src.startswith('R"', i) else None
        if m:
            d = m.group(1); j = src.find(')' + d + '"', i)
            j = n if j < 0 else j
            seg = src[i:j + len(d) + 2]
            out.append('""' + '\n' * seg.count('\n')); i = j + len(d) + 2; continue
        if c == "'" and re.search(r"\b\d[\w']*$", src[max(0, i - 24):i]) and src[i + 1:i + 2].isalnum():
            out.append(c); i += 1; continue  # a digit separator: 10'000'000
        if c in '"\'':
            j = i + 1
            while j < n and src[j] != c and not (c == "'" and src[j] == '\n'):
                j += 2 if src[j] == '\\' else 1
            out.append(c + c); i = j + 1; continue
        out.append(c); i += 1
    return ''.join(out)

def functions(path):
    lines = strip(open(path).read()).split('\n')
    res = []
    i = 0
    while i < len(lines):
        l = lines[i]
        # "f(...) {" on one line, or kernel style: "f(...)" then "{" alone.
        kernel_style = l.strip() == '{' and i > 0 and lines[i - 1].rstrip().endswith(')') and not CTRL.search(lines[i - 1])
        if kernel_style or (HEAD_END.search(l) and not CTRL.search(l)):
            if kernel_style:
                l = lines[i - 1]
            # find signature start for the name
            depth, j = 0, i
            start = i
            for k in range(i, len(lines)):
                depth += lines[k].count('{') - lines[k].count('}')
                if depth <= 0 and k >= i:
                    res.append((i + 1, k - i + 1, l.strip()[:90])); break
            i += 1
            continue
        i += 1
    return res

limit = int(sys.argv[1])
seen, long_ones = 0, 0
for p in sys.argv[2:]:
    for line, n, head in functions(p):
        seen += 1
        if n > limit:
            long_ones += 1
            print(f"{p}:{line}: {n} lines (limit {limit}): {head}")
if seen == 0:
    sys.exit("check_function_length: no functions found: the file list or the parser is wrong")
print(f"{seen} functions, {long_ones} over {limit} lines")
sys.exit(1 if long_ones else 0)
