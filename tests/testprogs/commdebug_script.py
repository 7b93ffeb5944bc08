#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A script written against torch's CommDebugMode: summarize(mode) asks only
CommDebugMode's query API, with the op objects CommDebugMode keys by.  The
side-by-side test runs it on CommDebugMode inside the job (tp_commdebug.py,
each step's "script") and, through the commdbg Python package, on commdbg's
dump of the same job:

    commdebug_script.py DUMP PID SCOPE     (torch and the commdbg package importable)
        prints summarize(commdbg.load(DUMP, pid=PID, scope=SCOPE)) as JSON
"""
import json
import sys


def summarize(mode):
    import torch
    import torch.distributed._functional_collectives  # noqa: F401 (registers torch.ops.c10d_functional)

    funcol = torch.ops.c10d_functional
    ops = {"all_reduce": funcol.all_reduce, "all_gather": funcol.all_gather_into_tensor,
           "reduce_scatter": funcol.reduce_scatter_tensor}
    counts = mode.get_comm_counts()
    out = {"total": mode.get_total_counts(), "counts": {}, "modules": {}, "parameters": {}, "sharding": {}}
    for name, op in ops.items():
        if counts.get(op, 0):
            out["counts"][name] = counts[op]
    for fqn, sides in mode.comm_module_counts.items():  # torch 2.6: an attribute, no getter
        for side in ("forward", "backward"):
            for name, op in ops.items():
                n = sides.get(side, {}).get(op, 0)
                if n:
                    out["modules"].setdefault(fqn, {}).setdefault(side, {})[name] = n
    for fqn, params in mode.get_parameter_info().items():
        out["parameters"][fqn] = {name: [list(p.shape), str(p.dtype).replace("torch.", "")]
                                  for name, p in params.items()}
    out["sharding"] = {key: str(placements) for key, placements in mode.get_sharding_info().items()}
    return out


if __name__ == "__main__":
    import commdbg

    print(json.dumps(summarize(commdbg.load(sys.argv[1], pid=int(sys.argv[2]), scope=sys.argv[3]))))
