#!/usr/bin/env python3
"""DeepSpeed v0.3.13's ZeRO-3 (March 2021) replayed by hand on fabricsim's collective and
compute times, for the six ZeRO-3 rows of Narayanan et al. (SC'21, Table 2) that
`validate --training` holds (README, "Known misses").

fabricsim times these rows with `gather_unit = "tensor_list"`: every parameter tensor of a
layer (twelve for a GPT layer) gathered in forward and once in backward, and
reduce-scattered, each call through PyTorch's list API. DeepSpeed v0.3.13
(`deepspeed/runtime/zero/stage3.py`, `partition_parameters.py`, defaults in `constants.py`)
does otherwise:
  - tensors under `stage3_param_persistence_threshold` (1e5 elements) stay resident and are
    never gathered: a GPT layer gathers its QKV, projection and two MLP weights;
  - a weight is released after use unless fewer than `stage3_max_reuse_distance` (1e9)
    parameters are used before its next use: after a layer's recomputed forward only the
    second MLP weight stays, so the backward gathers the other three again;
  - the next weight is prefetched only while fewer than `stage3_max_live_parameters` (1e9)
    parameters are gathered, and (PR #1188, 2021) each gather began with
    `torch.cuda.synchronize()`, so the prefetch did not overlap ("not async at all");
  - every gradient, small ones included, is reduce-scattered on its own.
This script prices that schedule with fabricsim's own numbers (`bench` for each NCCL call,
`train` for the compute; the list copies at the model's copy floor) and prints, per row, the
published throughput, fabricsim's, and this schedule's; then the published communication
(step minus fabricsim's compute) per TB of collective volume and doubling of the ranks.
Usage: zero3_deepspeed_v0313.py [path/to/fabricsim] [host ms per gather]. Takes a few minutes.
"""
import json
import math
import subprocess
import sys

FABRICSIM = sys.argv[1] if len(sys.argv) > 1 else "target/release/fabricsim"
HOST_MS = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
NCCL = ["--nccl", "NCCL_ALGO=^PAT", "--nccl", "NCCL_VERSION=2.8"]  # NCCL 2.8.3 ran them (training_runs.csv)
COPY_FLOOR_S = 4.3e-6  # src/workload/gpu_params.toml, copy_floor_us
HBM_BYTES_PER_S = 2.039e12 * 0.85  # A100 80 GB HBM at the model's hbm_eff

# (model file, hidden, layers, hw FLOPs per sequence with recomputation, [(gpus, mbs, gbs,
# published hw TFLOP/s)]) from validate/reference/training_runs.csv.
RUNS = [
    ("models/gpt3-175b.toml", 12288, 96, [(384, 4, 1536, 144), (768, 2, 1536, 88), (1536, 1, 1536, 44)]),
    ("models/megatron-gpt-529.6b.toml", 20480, 105, [(640, 4, 2560, 138), (1120, 2, 2240, 98), (2240, 1, 2240, 48)]),
]


def bench(nodes, kind, size):
    """Seconds of one `kind` collective of `size` bytes (nccl-tests' convention) on the
    nodes' 8 x nodes ranks."""
    out = subprocess.run(
        [FABRICSIM, "bench", "topologies/dgx-a100.toml", "--nodes", str(nodes), "-c", kind,
         "-b", str(size), "-e", str(size), "-d", "half"] + NCCL,
        check=True, capture_output=True, text=True).stdout
    row = [l for l in out.splitlines() if l.strip() and not l.startswith("#")][-1].split()
    return float(row[5]) * 1e-6


def train(model, gpus, mbs, gbs):
    out = subprocess.run(
        [FABRICSIM, "train", "--model", model, "--topology", "topologies/dgx-a100.toml",
         "--nodes", str(gpus // 8), "--tp", "1", "--pp", "1", "--mbs", str(mbs), "--gbs", str(gbs),
         "--seq", "2048", "--recompute", "full", "--attention", "unfused", "--zero", "3",
         "--gather-unit", "tensor_list", "--overlap-param-gather", "false", "--format", "json"] + NCCL,
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    law = []
    for model, h, layers, rows in RUNS:
        weights = {"qkv": 3 * h * h, "proj": h * h, "fc1": 4 * h * h, "fc2": 4 * h * h}
        for gpus, mbs, gbs, published in rows:
            nodes = gpus // 8
            r = train(model, gpus, mbs, gbs)
            compute = r["breakdown"]["compute_s"]
            step = r["step_time_s"]
            flops = r["hardware_tflops_per_gpu"] * step  # TFLOP per GPU and step

            def call(kind, elements):
                size = 2 * elements
                return (bench(nodes, kind, size) + gpus * COPY_FLOOR_S
                        + 2 * size / HBM_BYTES_PER_S + HOST_MS * 1e-3)

            ag = {w: call("allgather", e) for w, e in weights.items()}
            rs = {w: call("reducescatter", e) for w, e in weights.items()}
            # Eight small tensors a layer (biases, norms), each reduce-scattered on its own.
            small = call("reducescatter", gpus * 8) - HOST_MS * 1e-3
            # Forward and recomputed forward gather all four weights; the backward the three
            # released after the recomputation; no prefetch overlap.
            gathers = 2 * sum(ag.values()) + ag["qkv"] + ag["proj"] + ag["fc1"]
            comm = layers * (gathers + sum(rs.values()) + 8 * small)
            ds_step = compute + comm
            pub_step = flops / published
            print(f"{model.split('/')[1][:-5]:22} {gpus:5} GPUs: published {published:6.1f}, "
                  f"fabricsim {flops / step:6.1f} ({100 * (flops / step / published - 1):+5.1f}%), "
                  f"v0.3.13 schedule {flops / ds_step:6.1f} ({100 * (flops / ds_step / published - 1):+5.1f}%)"
                  f"  [compute {compute:.1f} s, published step {pub_step:.1f} s]")
            volume = 3 * 2 * sum(weights.values()) * layers  # two gathers, one reduce-scatter
            law.append((model, gpus, (pub_step - compute) / (volume / 1e12)))
    print("published communication per TB of volume (s/TB):")
    for i in range(1, len(law)):
        if law[i][0] == law[i - 1][0]:
            doublings = math.log2(law[i][1] / law[i - 1][1])
            print(f"  {law[i][0].split('/')[1][:-5]:22} {law[i - 1][1]:5} -> {law[i][1]:5} GPUs: "
                  f"{law[i - 1][2]:5.1f} -> {law[i][2]:5.1f}, "
                  f"{(law[i][2] - law[i - 1][2]) / doublings:+5.1f} per doubling")


if __name__ == "__main__":
    main()
