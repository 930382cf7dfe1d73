#!/usr/bin/env python3
"""Causal attention throughput on this machine's GPU 0, for the compute model's
`attention_eff` (src/workload/gpu_params.toml): the fraction of the dense BF16 peak a causal
FlashAttention kernel sustains, forward and forward + backward.

fabricsim's Rust code reaches cuBLAS but no attention kernel, so this one measurement goes
through PyTorch's scaled_dot_product_attention (each backend it has: FlashAttention, cuDNN),
timed with CUDA events over 10 back-to-back calls after 3 warm-ups, best of 3 batches.
FLOPs are counted as the model counts them (src/workload/flops.rs, `flops_causal`): the
forward's two products over the lower triangle, 2 * b * h * s^2 * d, and the backward as 2.5
forwards. Usage: attention.py OUT.csv [PEAK_TFLOPS, default 989 (H100/H200 SXM dense BF16)].
"""
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# (label, batch, query heads, kv heads, sequence, head dim)
SHAPES = [
    ("llama3-70b tp8", 1, 8, 1, 8192, 128),
    ("llama3-8b tp1", 1, 32, 8, 8192, 128),
    ("llama3-70b tp8 s4096 b2", 2, 8, 1, 4096, 128),
    ("gpt3-175b tp8 s2048 b4", 4, 12, 12, 2048, 128),
    ("llama3-405b tp8 s16384", 1, 16, 1, 16384, 128),
]
BATCH, WARMUP, TRIES = 10, 3, 3


def timed(fn):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(TRIES):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(BATCH):
            fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / BATCH * 1e3)
    return best  # microseconds


def main():
    out = sys.argv[1]
    peak = float(sys.argv[2]) if len(sys.argv) > 2 else 989.0
    dev = torch.cuda.get_device_name(0)
    rows = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for label, b, h, hkv, s, d in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(7)
            q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
            k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
            v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
            dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
            gqa = h != hkv
            fwd_flops = 2.0 * b * h * s * s * d
            try:
                with sdpa_kernel(backend):
                    def fwd():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

                    def fwd_bwd():
                        o = fwd()
                        o.backward(dout)

                    tf = timed(lambda: fwd())
                    tfb = timed(fwd_bwd)
            except Exception as e:  # a backend that does not take this shape
                print(f"{backend.name} {label}: skipped ({str(e).splitlines()[0][:120]})", flush=True)
                continue
            for what, t, flops in (("fwd", tf, fwd_flops), ("fwd_bwd", tfb, 3.5 * fwd_flops)):
                tflops = flops / t / 1e6
                rows.append((backend.name, label, b, h, hkv, s, d, what, t, tflops, tflops / peak))
                print(f"{backend.name:16} {label:26} {what:8} {t:10.1f} us {tflops:7.1f} TFLOP/s "
                      f"{tflops / peak:.3f} of peak", flush=True)
            del q, k, v, dout
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        f.write(f"# source: validate/gpu/attention.py on {dev}, torch {torch.__version__}, "
                f"CUDA {torch.version.cuda}, {time.strftime('%Y-%m-%d')}; peak {peak} TFLOP/s; "
                f"causal FLOPs as src/workload/flops.rs counts them, backward = 2.5 forwards\n")
        f.write("backend,shape,batch,heads,kv_heads,seq,head_dim,pass,time_us,tflops,fraction_of_peak\n")
        for r in rows:
            f.write(",".join(f"{x:.3f}" if isinstance(x, float) else str(x) for x in r) + "\n")


if __name__ == "__main__":
    main()
