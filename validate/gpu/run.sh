#!/usr/bin/env bash
# Runs fabricsim's GPU validation on this machine's GPUs and writes everything under $OUT
# (default ./gpu-out): the GPUs and their peer bandwidth, the one-GPU microbenchmarks (copies,
# reductions, launches, GEMMs by shape), causal attention and the per-rank cost of a list
# collective through PyTorch when it is there (attention.py, list_copies.py), and
# `validate --gpu` (simulated vs the same schedule on the GPUs vs NCCL,
# CSV in the layout of validate/reference/) for all-reduce by NCCL's pick, Ring and Tree,
# all-gather and reduce-scatter. Budget: about 7 minutes. Each step has its own timeout and
# a failed step does not stop the others; run.log and status.txt say what happened, and
# everything is also packed into results.tar.gz.
#
# Needs: the NVIDIA driver; NVRTC, cuBLAS and NCCL libraries (CUDA toolkit, distribution
# packages or the nvidia-* pip wheels) for the steps that use them. cudarc looks for
# libnccl.so, which NCCL's runtime packages do not ship (only libnccl.so.2): this script
# links it in a private folder. It builds with `cargo build --release --features cuda` when
# cargo is present, else uses $FABRICSIM_BIN or target/release/fabricsim (built here with
# the feature and carried over).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
status() { echo "$1 rc=$2" | tee -a "$OUT/status.txt"; }
echo "== fabricsim GPU validation, $(date -u +%FT%TZ), $(hostname)"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
  nvidia-smi topo -m >> "$OUT/nvidia-smi.txt" 2>&1
  nvidia-smi -L
fi

# Libraries: find NCCL, NVRTC and cuBLAS wherever they are, and give cudarc the names it
# searches for.
LIBDIR="$OUT/.libs"
mkdir -p "$LIBDIR"
roots=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/lib /opt)
for py in python3 python; do
  if command -v "$py" >/dev/null; then
    sp=$("$py" -c 'import site,sys; print(" ".join(site.getsitepackages()+[site.getusersitepackages()]))' 2>/dev/null) || sp=""
    for d in $sp; do [ -d "$d/nvidia" ] && roots+=("$d/nvidia"); done
  fi
done
link() { # link NAME PATTERN: the first file matching PATTERN under the roots becomes LIBDIR/NAME
  local name=$1 pat=$2 f
  for r in "${roots[@]}"; do
    [ -d "$r" ] || continue
    f=$(find -L "$r" -maxdepth 5 -name "$pat" -print -quit 2>/dev/null)
    if [ -n "$f" ]; then ln -sf "$f" "$LIBDIR/$name"; echo "lib: $name -> $f"; return 0; fi
  done
  echo "lib: $name not found (pattern $pat)"; return 1
}
link libnccl.so 'libnccl.so.2*'
link libnvrtc.so 'libnvrtc.so.1[0-9]*' || link libnvrtc.so 'libnvrtc.so'
link libcublas.so 'libcublas.so.1[0-9]*' || link libcublas.so 'libcublas.so'
# libnvrtc loads its builtins library from its own folder.
for f in "$LIBDIR"/*; do d=$(dirname "$(readlink -f "$f")"); case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}";; esac; done
# The driver's own folder, where the loader's cache does not list libcuda.so.1.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/wsl/lib; do
    [ -e "$d/libcuda.so.1" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && echo "lib: libcuda.so.1 in $d"
  done
fi
export LD_LIBRARY_PATH="$LIBDIR:${LD_LIBRARY_PATH:-}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

BIN="${FABRICSIM_BIN:-}"
if [ -z "$BIN" ] && command -v cargo >/dev/null; then
  timeout 300 cargo build --release --features cuda; status build $?
fi
BIN="${BIN:-target/release/fabricsim}"
if [ ! -x "$BIN" ]; then echo "no fabricsim binary ($BIN): build with --features cuda first"; status binary 1; exit 2; fi

timeout 120 "$BIN" gpu-info --microbench --max-bytes 1G --out "$OUT/gpu-info"; status gpu-info $?
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  timeout 90 python3 validate/gpu/attention.py "$OUT/gpu-info/attention.csv"; status attention $?
  timeout 60 python3 validate/gpu/list_copies.py "$OUT/gpu-info/list_copies.csv"; status list-copies $?
else
  echo "attention: skipped (no python3 with a CUDA PyTorch)"
fi
# One schedule per size, checked bit for bit against the CPU up to --check-max, timed.
v() { # v NAME TIMEOUT ARGS...: one validate --gpu run into $OUT/NAME
  local name=$1 t=$2; shift 2
  timeout "$t" "$BIN" validate --gpu "$@" --out "$OUT/$name"; status "$name" $?
}
v allreduce 120 -c allreduce -b 8 -e 256M -f 8 --iters 5 --warmup 1 --check-max 16M
v allreduce-ring 45 -c allreduce --algo ring -b 1K -e 64M -f 64 --iters 3 --warmup 1 --check-max 64M
v allreduce-tree 45 -c allreduce --algo tree -b 1K -e 64M -f 64 --iters 3 --warmup 1 --check-max 64M
v allgather 45 -c allgather -d bfloat16 -b 1K -e 16M -f 16 --iters 3 --warmup 1
v reducescatter 45 -c reducescatter -d half -b 1K -e 16M -f 16 --iters 3 --warmup 1
tar -czf /tmp/fabricsim-results.tar.gz --exclude=.libs -C "$OUT" . && mv /tmp/fabricsim-results.tar.gz "$OUT/results.tar.gz"
echo "== done, $(date -u +%FT%TZ)"
