#!/usr/bin/env python3
"""What a PyTorch list collective costs per rank on this machine's GPU 0, for the compute
model's `copy_floor_us` (src/workload/gpu_params.toml) and `gather_unit = "tensor_list"`.

PyTorch's ProcessGroupNCCL runs `all_gather(list, tensor)` through one flat buffer and then
copies each rank's piece out of it, one `copy_` per rank (a list `reduce_scatter` copies the
pieces in first); DeepSpeed's first ZeRO-3 also built the list with one Python `narrow` per
rank. One GPU cannot run the N-rank collective, but the per-rank work can be timed alone:
for N pieces of a tensor, (1) the host time of N `narrow` calls, (2) the host time of N
`copy_` calls issued back to back (from Python, so an upper bound on PyTorch's C++ loop),
and (3) the GPU time of those N copies (CUDA events around them, after the host has queued
them all behind a busy kernel, so that the GPU runs them back to back). The model charges
max(host, GPU) per piece; today it charges the GPU floor measured by `gpu-info` (4.3 us on an
H200). Usage: list_copies.py OUT.csv. Budget: well under a minute.
"""
import sys
import time

import torch

# Ranks, and tensor sizes in elements (BF16): a GPT-3 175B layer's LayerNorm scale, QKV
# bias, its projection weight and its fc1 weight (12,288 wide).
RANKS = [64, 384, 768, 1536]
ELEMENTS = [12_288, 36_864, 12_288 * 12_288, 12_288 * 49_152]
TRIES = 3


def busy(ms):
    """One kernel that keeps the GPU busy for at least about `ms` milliseconds (a spin of
    `ms` ms at 2 GHz, longer at a lower clock), so that the copies queued behind it run back
    to back whatever the host's pace."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(int(ms * 2e6))
    else:  # one large GEMM instead: about 2 ms on an H100-class GPU per 8192^3
        a = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(max(1, int(ms / 2))):
            a @ a


def measure(n, elements):
    piece = -(-elements // n)  # ceil, as DeepSpeed pads a parameter to a multiple of N
    flat = torch.empty(piece * n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(piece * n, device="cuda", dtype=torch.bfloat16)
    best = [float("inf")] * 3
    for _ in range(TRIES):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        views = [flat.narrow(0, piece * i, piece) for i in range(n)]
        narrow_us = (time.perf_counter() - t0) * 1e6 / n
        outs = [out.narrow(0, piece * i, piece) for i in range(n)]
        # Host time per copy_ (the GPU may run behind; nothing waits for it here).
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for o, v in zip(outs, views):
            o.copy_(v, non_blocking=True)
        host_us = (time.perf_counter() - t0) * 1e6 / n
        torch.cuda.synchronize()
        # GPU time per copy: queued behind a busy stretch, timed by events on the stream.
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        busy(50)
        a.record()
        for o, v in zip(outs, views):
            o.copy_(v, non_blocking=True)
        b.record()
        b.synchronize()
        gpu_us = a.elapsed_time(b) * 1e3 / n
        best = [min(x, y) for x, y in zip(best, (narrow_us, host_us, gpu_us))]
    return best


def main():
    out = sys.argv[1]
    dev = torch.cuda.get_device_name(0)
    rows = []
    for n in RANKS:
        for e in ELEMENTS:
            narrow_us, host_us, gpu_us = measure(n, e)
            rows.append((n, 2 * e, narrow_us, host_us, gpu_us))
            print(f"{n:5d} ranks, {2 * e:>13,d} B: narrow {narrow_us:6.2f} us, copy_ host {host_us:6.2f} us, "
                  f"GPU {gpu_us:6.2f} us per rank", flush=True)
    with open(out, "w") as f:
        f.write(f"# source: validate/gpu/list_copies.py on {dev}, torch {torch.__version__}, "
                f"{time.strftime('%Y-%m-%d', time.gmtime())}; best of {TRIES}; microseconds per rank\n")
        f.write("ranks,bytes,narrow_host_us,copy_host_us,copy_gpu_us\n")
        for r in rows:
            f.write("%d,%d,%.3f,%.3f,%.3f\n" % r)


if __name__ == "__main__":
    main()
