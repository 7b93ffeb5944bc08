#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The demo's per-module counts: commdbg's JSON dump read through the commdbg
Python package (CommDebugMode's query API), one line per traced rank:

    commdbg: pid 4242: <root> forward all_reduce=6; blocks.0 forward all_reduce=3; ...

    python3 demo/module_counts.py DUMP
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import commdbg  # noqa: E402

with open(sys.argv[1], encoding="utf-8") as f:
    dump = json.load(f)
for proc in dump.get("processes", [dump]):
    mode = commdbg.load(proc)
    if not mode.get_total_counts():
        continue
    parts = []
    for path, sides in sorted(mode.comm_module_counts.items()):
        if path == "Global":
            continue
        path = "<root>" if path == mode.root else path[len(mode.root) + 1:]
        for side in ("forward", "backward"):
            for kind, n in sorted(sides[side].items()):
                parts.append(f"{path} {side} {kind}={n}")
    print(f"commdbg: pid {proc['process']['pid']}: {'; '.join(parts)}")
