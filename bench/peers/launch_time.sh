#!/usr/bin/env bash
# Launch time of gearrun against Open MPI's mpirun, medians of several runs taken
# in one invocation (gearbench launch: the commands run in turn, so that drift
# in the machine's load touches both alike):
#   1. `-np N /bin/true`            (the launcher alone)
#   2. `-np N hello`                (rendezvous and a barrier: examples/hello
#                                    against bench/peers/mpi_hello.c)
# Each is measured for gearrun built static (CGO_ENABLED=0) and as plain `go
# build` gives it (cgo on where a C compiler exists: dynamically linked, with
# NVML discovery). It installs openmpi-bin and libopenmpi-dev with apt-get when
# mpirun or mpicc is missing (run it as root), builds the programs, and prints
# each median with its ratio to mpirun's.
# Usage: bench/peers/launch_time.sh [-n RUNS] [-np N] [--json]
set -euo pipefail

runs=21
np=4
json=()
while [ $# -gt 0 ]; do
	case "$1" in
	-n) runs=$2; shift 2 ;;
	-np) np=$2; shift 2 ;;
	--json) json=(--json); shift ;;
	*) echo "usage: $0 [-n RUNS] [-np N] [--json]" >&2; exit 2 ;;
	esac
done

cd "$(dirname "$0")/../.."
. bench/peers/openmpi.sh
need_openmpi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
CGO_ENABLED=0 go build -o "$work/gearrun" ./cmd/gearrun
CGO_ENABLED=0 go build -o "$work/hello" ./examples/hello
go build -o "$work/gearrun-cgo" ./cmd/gearrun
go build -o "$work/hello-cgo" ./examples/hello
go build -o "$work/gearbench" ./cmd/gearbench
mpicc -O2 -o "$work/mpi_hello" bench/peers/mpi_hello.c

mpiflags=(--oversubscribe)
if [ "$(id -u)" = 0 ]; then
	mpiflags+=(--allow-run-as-root)
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Keep Open MPI on this machine's shared memory and loopback, quietly.
export OMPI_MCA_btl_base_warn_component_unused=0
export GEAR_RUNTIME_DIR="$work/run"

echo "launch time, median of $runs runs, -np $np, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# /bin/true (target: gearrun <= 0.25 x mpirun)"
"$work/gearbench" launch -n "$runs" "${json[@]}" \
	"$work/gearrun" -np "$np" /bin/true \
	--vs "$work/gearrun-cgo" -np "$np" /bin/true \
	--vs mpirun "${mpiflags[@]}" -np "$np" /bin/true
echo "# hello: rendezvous and a barrier (target: gearrun <= 0.5 x mpirun)"
"$work/gearbench" launch -n "$runs" "${json[@]}" \
	"$work/gearrun" -np "$np" "$work/hello" \
	--vs "$work/gearrun-cgo" -np "$np" "$work/hello-cgo" \
	--vs mpirun "${mpiflags[@]}" -np "$np" "$work/mpi_hello"
