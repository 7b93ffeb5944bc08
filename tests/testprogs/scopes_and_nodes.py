# SPDX-License-Identifier: Apache-2.0
# `scopes` record_function scopes, each around `passes` backward passes of a
# small graph: torch builds an at::RecordFunction of its own around every
# autograd node it runs (a BACKWARD_FUNCTION scope), profiler or not.
# Prints {"scopes": N, "nodes_per_pass": M} for the test.
import json
import sys

import torch

scopes, passes = int(sys.argv[1]), int(sys.argv[2])
x = torch.randn(8, 8, requires_grad=True)
for _ in range(scopes):
    with torch.autograd.profiler.record_function("outer"):
        for _ in range(passes):
            y = (x @ x).relu().sum()
            y.backward()
nodes, todo = 0, [y.grad_fn]
while todo:
    n = todo.pop()
    if n is None:
        continue
    nodes += 1
    todo.extend(f for f, _ in n.next_functions)
print(json.dumps({"scopes": scopes, "nodes_per_pass": nodes}), flush=True)
