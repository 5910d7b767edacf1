"""Probe: is the add + RMSNorm ceiling at 16384 rows set by the traffic mix, by the buffers'
relative placement, or by the norm kernel? (bench/TUNING.md, "The norm's 16384-row wall").

Times, with peers.py's method (do_bench: L2 flushed, median), Triton's norm (the peer kernel),
an elementwise kernel with the same traffic and no reduction (2 reads, 2 writes), one with 2
reads and 1 write, and torch's copy; the four buffers allocated separately or as slices of one
allocation at several gaps. On the GPU machine: `python3 bench/probe_norm_wall.py [OUT.json]`.
"""

import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import _norm_warps, add_rmsnorm_fwd_kernel  # noqa: E402

SHAPES = [(16384, 4096), (16384, 3584), (16384, 8192), (8192, 4096)]
# "sep": one allocation per buffer; a number: one allocation, this many bytes between buffers.
LAYOUTS = ["sep", 0, 4096, 69632, 1060864, 33562624]
TILE = 2048


@triton.jit
def two_in_two_out(x_ptr, r_ptr, h_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m).to(tl.float32)
    r = tl.load(r_ptr + o, mask=m).to(tl.float32)
    tl.store(h_ptr + o, (x + r).to(h_ptr.dtype.element_ty), mask=m)
    tl.store(y_ptr + o, (x * r).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def two_in_one_out(x_ptr, r_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m).to(tl.float32)
    r = tl.load(r_ptr + o, mask=m).to(tl.float32)
    tl.store(y_ptr + o, (x * r).to(y_ptr.dtype.element_ty), mask=m)


def buffers(rows, cols, layout, dev):
    n = rows * cols
    if layout == "sep":
        bufs = [torch.empty(n, dtype=torch.bfloat16, device=dev) for _ in range(4)]
    else:
        per = n * 2 + layout
        big = torch.empty(4 * per, dtype=torch.uint8, device=dev)
        bufs = [big[i * per:i * per + n * 2].view(torch.bfloat16) for i in range(4)]
    for b in bufs[:2]:
        b.uniform_(-4, 4)
    return [b.view(rows, cols) for b in bufs]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "norm_wall.json"
    dev = torch.device("cuda")
    results = []
    for rows, cols in SHAPES:
        n = rows * cols
        block = triton.next_power_of_2(cols)
        w = torch.rand(cols, dtype=torch.bfloat16, device=dev) + 0.5
        for layout in LAYOUTS:
            x, r, h, y = buffers(rows, cols, layout, dev)
            grid = (triton.cdiv(n, TILE),)
            kernels = {
                "norm": (lambda: add_rmsnorm_fwd_kernel[(rows,)](
                    x, r, w, h, y, cols, cols, 1e-6, GEMMA=False, BLOCK=block,
                    num_warps=_norm_warps(block)), 4),
                "2r2w": (lambda: two_in_two_out[grid](x, r, h, y, n, BLOCK=TILE, num_warps=4), 4),
                "2r1w": (lambda: two_in_one_out[grid](x, r, y, n, BLOCK=TILE, num_warps=4), 3),
                "copy": (lambda: h.copy_(x), 2),
            }
            for name, (fn, tensors) in kernels.items():
                us = triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3
                gbs = tensors * n * 2 / us / 1e3
                results.append(dict(rows=rows, cols=cols, layout=str(layout), kernel=name,
                                    us=us, gbs=gbs))
                print(f"{rows}x{cols} {str(layout):>9} {name:5} {us:8.2f} us {gbs:7.0f} GB/s",
                      flush=True)
            del x, r, h, y
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
