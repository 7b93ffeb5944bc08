# SPDX-License-Identifier: Apache-2.0
"""Tensors for commdbg to read from outside (tests/e2e/test_tensor_layout.cpp).

Prints one JSON line: this process's pid and, per tensor, its TensorImpl's
address (Tensor._cdata) with what torch itself says of it (shape, dtype,
numel, bytes); then holds the tensors until its parent goes (or 120 s)."""
import ctypes
import json
import os
import sys
import time

import torch

PR_SET_PDEATHSIG = 1
ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 15)

base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
tensors = [
    torch.zeros(3, 4),                                    # float32, 2 dims
    torch.arange(10),                                     # int64
    torch.tensor(2.5, dtype=torch.float64),               # 0 dims
    torch.ones(2, 1, 3, 1, 2, 2, dtype=torch.float16),    # 6 dims: sizes on the heap
    torch.zeros(1, 2, 1, 2, 1, 2, 3, dtype=torch.bool),   # 7 dims
    torch.ones(2, 1, 2, 1, 2, dtype=torch.int8),          # 5 dims: the last inline count
    torch.empty(0, 5, dtype=torch.int32),                 # no elements
    base.transpose(0, 2),                                 # a view, not contiguous
    base[1:, 1:],                                         # a view at a storage offset
    torch.zeros(4, 4, dtype=torch.bfloat16),
    torch.zeros(3, dtype=torch.complex64),
    torch.zeros(7, dtype=torch.uint8),
    torch.zeros(2, 2, dtype=torch.int16),
]
out = {"pid": os.getpid(), "torch": torch.__version__, "tensors": [
    {"cdata": t._cdata, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
     "numel": t.numel(), "bytes": t.numel() * t.element_size()} for t in tensors]}
print(json.dumps(out), flush=True)
deadline = time.time() + 120
while time.time() < deadline and os.getppid() != 1:
    time.sleep(0.05)
sys.exit(0)
