#!/usr/bin/env bash
# Runs `fabricsim validate --gpu --multi-node` across nodes with Open MPI's mpirun: one
# process per GPU, ranks placed in blocks of GPUS per node, NCCL's unique id exchanged
# through fabricsim's TCP rendezvous on the first host. Rank 0 prints simulated vs
# schedule-on-GPU vs NCCL and writes the CSVs under validate/measurements/ (or $OUT).
# Step by step: README, "Validating across nodes".
#
#   HOSTS=node001,node002 validate/gpu/multinode-mpirun.sh
#   HOSTS=node001,node002 GPUS=8 validate/gpu/multinode-mpirun.sh -c allgather -b 1K -e 256M
#
# Needs: the same fabricsim binary and repository path on every host (a shared file system,
# or copy them), passwordless ssh between the hosts (as mpirun needs), and the rendezvous
# port (MASTER_PORT, default 29500) free on the first host and reachable from the others.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HOSTS:?set HOSTS to a comma-separated list of hosts, the first runs rank 0}"
GPUS="${GPUS:-8}"
BIN="${FABRICSIM_BIN:-$PWD/target/release/fabricsim}"
[ -x "$BIN" ] || { echo "no $BIN: build with cargo build --release --features cuda"; exit 2; }
IFS=, read -r -a H <<< "$HOSTS"
NP=$(( ${#H[@]} * GPUS ))
HOSTLIST=$(printf "%s:$GPUS," "${H[@]}"); HOSTLIST=${HOSTLIST%,}
MASTER_ADDR="${MASTER_ADDR:-${H[0]}}"
MASTER_PORT="${MASTER_PORT:-29500}"

# cudarc looks for libnccl.so; NCCL's runtime package ships only libnccl.so.2: link it in a
# folder every host can see (here: next to the binary's repository).
LIBDIR="$PWD/target/fabricsim-libs"
mkdir -p "$LIBDIR"
NCCL_SO=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
if [ -n "${NCCL_SO:-}" ]; then ln -sf "$NCCL_SO" "$LIBDIR/libnccl.so"; fi

ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-c allreduce -b 8 -e 1G -f 4 --iters 10 --warmup 2 --check-max 64M)
OUTARGS=()
[ -n "${OUT:-}" ] && OUTARGS=(--out "$OUT")

# Site NCCL settings go through -x, e.g. -x NCCL_IB_HCA=mlx5 -x NCCL_SOCKET_IFNAME=ib0.
mpirun -np "$NP" --host "$HOSTLIST" --map-by "ppr:$GPUS:node" --bind-to none \
  -x MASTER_ADDR="$MASTER_ADDR" -x MASTER_PORT="$MASTER_PORT" \
  -x LD_LIBRARY_PATH="$LIBDIR:${LD_LIBRARY_PATH:-}" -x NCCL_DEBUG="${NCCL_DEBUG:-WARN}" \
  "$BIN" validate --gpu --multi-node --launcher mpi --gpus-per-process 1 --root "$PWD" \
  "${ARGS[@]}" "${OUTARGS[@]}"
