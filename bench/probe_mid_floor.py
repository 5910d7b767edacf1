"""Probe: how fast can a kernel with the same traffic go at the mid sizes where the graph-mode
target set for this work (1.10x the best peer) is missed? (bench/TUNING.md, "Floors at the
mid sizes").

CUDA-graph replay with peers.py's method (do_bench_cudagraph, median), on the shapes given:
- gated (split, bf16): the Triton peer (SiLU) and the same kernel computing `a * b` (no
  activation: the traffic and launch with no MUFU work);
- add + RMSNorm (bf16): the Triton peer, the same one-program-per-row kernel without the
  reduction (`y = h * w`), and an elementwise kernel with the same traffic (2 reads, 2 writes);
- Triton's empty kernel (its launch floor in this mode).
On the GPU machine: `python3 bench/probe_mid_floor.py [OUT.json]`.
"""

import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import (  # noqa: E402
    ACT_SILU, TILE, _norm_warps, _tile_grid, add_rmsnorm_fwd_kernel, empty_kernel,
    gated_fwd_kernel,
)
from probe_norm_wall import two_in_two_out  # noqa: E402

GATED = [(64, 14336), (64, 28672), (256, 14336), (256, 28672), (1024, 14336)]
NORM = [(256, 4096), (256, 8192), (1024, 3584), (1024, 4096), (1024, 8192)]
GRAPH_REP_MS = 10


@triton.jit
def gated_mul_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # gated_fwd_kernel's FLAT path without the activation.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (a * b).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def add_norm_no_reduce_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, stride, H,
                              BLOCK: tl.constexpr):
    # add_rmsnorm_fwd_kernel without the sum: same loads, stores and launch.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    h = x + r
    tl.store(h_ptr + row * stride + cols, h.to(h_ptr.dtype.element_ty), mask=mask)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride + cols, (h * w).to(y_ptr.dtype.element_ty), mask=mask)


def graph_us(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=GRAPH_REP_MS, return_mode="median") * 1e3


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "mid_floor.json"
    dev = torch.device("cuda")
    bf = torch.bfloat16
    results = [dict(kernel="empty", us=graph_us(lambda: empty_kernel[(1,)]()))]
    print(f"empty {results[0]['us']:.2f} us", flush=True)
    for rows, cols in GATED:
        n = rows * cols
        a, b = (torch.empty(n, dtype=bf, device=dev).uniform_(-4, 4) for _ in range(2))
        y = torch.empty(n, dtype=bf, device=dev)
        kernels = {
            "gated_silu": lambda: gated_fwd_kernel[_tile_grid(n)](
                a, b, y, n, cols, cols, cols, cols, ACT=ACT_SILU, FLAT=True, BLOCK=TILE),
            "gated_mul": lambda: gated_mul_kernel[_tile_grid(n)](a, b, y, n, BLOCK=TILE),
        }
        for name, fn in kernels.items():
            results.append(dict(op="gated_fwd", rows=rows, cols=cols, kernel=name,
                                us=graph_us(fn)))
            print(f"{rows}x{cols} {name:18} {results[-1]['us']:7.2f} us", flush=True)
    for rows, cols in NORM:
        n = rows * cols
        block = triton.next_power_of_2(cols)
        warps = _norm_warps(block)
        x, r = (torch.empty(n, dtype=bf, device=dev).uniform_(-4, 4) for _ in range(2))
        h, y = (torch.empty(n, dtype=bf, device=dev) for _ in range(2))
        w = torch.rand(cols, dtype=bf, device=dev) + 0.5
        kernels = {
            "norm": lambda: add_rmsnorm_fwd_kernel[(rows,)](
                x, r, w, h, y, cols, cols, 1e-6, GEMMA=False, BLOCK=block, num_warps=warps),
            "norm_no_reduce": lambda: add_norm_no_reduce_kernel[(rows,)](
                x, r, w, h, y, cols, cols, BLOCK=block, num_warps=warps),
            "2r2w": lambda: two_in_two_out[(triton.cdiv(n, 2048),)](
                x, r, h, y, n, BLOCK=2048, num_warps=4),
        }
        for name, fn in kernels.items():
            results.append(dict(op="add_rmsnorm_fwd", rows=rows, cols=cols, kernel=name,
                                us=graph_us(fn)))
            print(f"{rows}x{cols} {name:18} {results[-1]['us']:7.2f} us", flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
