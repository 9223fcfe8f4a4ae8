#!/usr/bin/env bash
# Wall time of a job that joins the world, builds the communicator and runs one
# 8-byte AllReduce: `gearrun -np N gearbench setup` against `mpirun -np N
# mpi_setup` (bench/peers/mpi_setup.c), medians of several runs taken in one
# invocation (gearbench launch: the commands alternate, so that drift in the
# machine's load touches both alike). Before the comparison it prints one
# `gearbench setup` line per N: each step's time and the shared memory the
# communicator took. It installs openmpi-bin and libopenmpi-dev with apt-get when
# mpirun or mpicc is missing (run it as root).
# Usage: bench/peers/setup.sh [-n RUNS] [NP ...]   (default: 5 runs, 64 128)
set -euo pipefail

runs=5
while [ $# -gt 0 ]; do
	case "$1" in
	-n) runs=$2; shift 2 ;;
	*) break ;;
	esac
done
nps=("$@")
[ ${#nps[@]} -gt 0 ] || nps=(64 128)

cd "$(dirname "$0")/../.."
. bench/peers/openmpi.sh
need_openmpi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
CGO_ENABLED=0 go build -o "$work/gearrun" ./cmd/gearrun
CGO_ENABLED=0 go build -o "$work/gearbench" ./cmd/gearbench
mpicc -O2 -o "$work/mpi_setup" bench/peers/mpi_setup.c

mpiflags=(--oversubscribe)
if [ "$(id -u)" = 0 ]; then
	mpiflags+=(--allow-run-as-root)
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_btl_base_warn_component_unused=0
export GEAR_RUNTIME_DIR="$work/run"

for np in "${nps[@]}"; do
	echo "# -np $np, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
	"$work/gearrun" -np "$np" "$work/gearbench" setup
	"$work/gearbench" launch -n "$runs" \
		"$work/gearrun" -np "$np" "$work/gearbench" setup \
		--vs mpirun "${mpiflags[@]}" -np "$np" "$work/mpi_setup"
done
