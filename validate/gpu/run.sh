#!/usr/bin/env bash
# Runs fabricsim's GPU validation on this machine's GPUs and writes everything under $OUT
# (default ./gpu-out): the GPUs and their peer bandwidth, the one-GPU microbenchmarks, and
# `validate --gpu` (simulated vs the same schedule on the GPUs vs NCCL, CSV in the layout of
# validate/reference/). Budget: about 10 minutes. Each step has its own timeout and a failed
# step does not stop the others; run.log and status.txt say what happened.
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
export LD_LIBRARY_PATH="$LIBDIR:${LD_LIBRARY_PATH:-}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

BIN="${FABRICSIM_BIN:-}"
if [ -z "$BIN" ] && command -v cargo >/dev/null; then
  timeout 300 cargo build --release --features cuda; status build $?
fi
BIN="${BIN:-target/release/fabricsim}"
if [ ! -x "$BIN" ]; then echo "no fabricsim binary ($BIN): build with --features cuda first"; status binary 1; exit 2; fi

timeout 150 "$BIN" gpu-info --microbench --max-bytes 1G --out "$OUT/gpu-info"; status gpu-info $?
# One schedule per size, checked bit for bit against the CPU up to 16M, timed 5 times.
timeout 240 "$BIN" validate --gpu -c allreduce -b 8 -e 256M -f 4 --iters 5 --warmup 1 --check-max 16M \
  --out "$OUT/validate-allreduce"; status validate-allreduce $?
timeout 90 "$BIN" validate --gpu -c allgather -d bfloat16 -b 1K -e 16M -f 16 --iters 3 --warmup 1 \
  --out "$OUT/validate-allgather"; status validate-allgather $?
echo "== done, $(date -u +%FT%TZ)"
