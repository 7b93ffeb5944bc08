#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_namespaces.py [--namespace NS] ROOT LAYER...: the namespace of a file
says its layer.

Under ROOT (a userspace/-like folder, LAYERS bottom to top), every top-level
named namespace in LAYER/* is commdbg::LAYER (or nested in it); common/ is the
root namespace commdbg (and commdbg::limits).  With --namespace, every layer's
is NS (the daemon's folders: one program, one namespace commdbg::daemon, on
top of all of libcommdbg).  A block of another namespace may
only forward-declare (`class X;`), and only names of a layer below or of an
outside library, so even a declaration never points upward.  Prints every
breach and exits 1 when there is one."""
import pathlib, re, sys

OPEN = re.compile(r'^namespace\s+([\w:]*)\s*\{')
CLOSE = re.compile(r'^\}\s*//\s*namespace')
FORWARD = re.compile(r'^(class|struct)\s+\w+;$|^enum class\s+\w+\s*:\s*\w+;$')


def blocks(text):
    """(namespace, first line, body lines) of each top-level named namespace."""
    depth, out, cur = 0, [], None
    for n, line in enumerate(text.split('\n'), 1):
        if OPEN.match(line):
            if depth == 0 and OPEN.match(line).group(1):
                cur = (OPEN.match(line).group(1), n, [])
                out.append(cur)
            depth += 1
        elif CLOSE.match(line):
            depth = max(0, depth - 1)
            if depth == 0:
                cur = None
        elif cur is not None:
            cur[2].append(line)
    return out


def own_namespaces(layer, shared):
    if shared:
        return (shared,)
    return ('commdbg', 'commdbg::limits') if layer == 'common' else ('commdbg::' + layer,)


def within(ns, base):
    return ns == base or ns.startswith(base + '::')


def below(ns, layers, i, shared):
    """Whether namespace `ns` is one of a layer below layers[i]."""
    if shared:  # the daemon: all of libcommdbg is below it
        return within(ns, 'commdbg')
    return (i > 0 and ns == 'commdbg') or any(within(ns, 'commdbg::' + l) for l in layers[:i])


def breaches(root, layers, shared=None):
    for i, layer in enumerate(layers):
        own = own_namespaces(layer, shared)
        for f in sorted((root / layer).glob('*.[ch]pp')):
            for ns, line, body in blocks(f.read_text()):
                if ns in own or any(within(ns, o) for o in own if o != 'commdbg'):
                    continue
                code = [l.split('//')[0].strip() for l in body]
                code = [l for l in code if l]
                where = f'{f.relative_to(root)}:{line}: namespace {ns}'
                if not all(FORWARD.match(l) for l in code):
                    yield f'{where}: a {layer}/ file declares its names in {own[0]}, not here'
                elif within(ns, 'commdbg') and not below(ns, layers, i, shared):
                    yield f'{where}: forward-declares names of a layer that is not below {layer}/'


def main():
    args = sys.argv[1:]
    shared = None
    if args[:1] == ['--namespace']:
        shared, args = args[1], args[2:]
    root, layers = pathlib.Path(args[0]), args[1:]
    found = list(breaches(root, layers, shared))
    for b in found:
        print(b)
    print(f'{len(found)} namespace breaches in {", ".join(layers)}')
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
