#!/usr/bin/env bash
# Launch time of gearrun against Open MPI's mpirun, medians of several runs taken
# in one invocation:
#   1. `-np N /bin/true`            (the launcher alone)
#   2. `-np N hello`                (rendezvous and a barrier: examples/hello
#                                    against bench/peers/mpi_hello.c)
# It installs openmpi-bin and libopenmpi-dev with apt-get when mpirun or mpicc is
# missing (run it as root), builds both programs, and prints the ratios
# gearrun/mpirun. Usage: bench/peers/launch_time.sh [-n RUNS] [-np N]
set -euo pipefail

runs=15
np=4
while [ $# -gt 0 ]; do
	case "$1" in
	-n) runs=$2; shift 2 ;;
	-np) np=$2; shift 2 ;;
	*) echo "usage: $0 [-n RUNS] [-np N]" >&2; exit 2 ;;
	esac
done

cd "$(dirname "$0")/../.."
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
	echo "installing Open MPI (openmpi-bin libopenmpi-dev)..." >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq openmpi-bin libopenmpi-dev >&2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Static binaries: without cgo the net package needs no dynamic loader, which
# saves a few milliseconds of every start.
CGO_ENABLED=0 go build -o "$work/gearrun" ./cmd/gearrun
CGO_ENABLED=0 go build -o "$work/hello" ./examples/hello
mpicc -O2 -o "$work/mpi_hello" bench/peers/mpi_hello.c

mpiflags=(--oversubscribe)
if [ "$(id -u)" = 0 ]; then
	mpiflags+=(--allow-run-as-root)
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Keep Open MPI on this machine's shared memory and loopback, quietly.
export OMPI_MCA_btl_base_warn_component_unused=0
export GEAR_RUNTIME_DIR="$work/run"

# measure CMD...: runs CMD $runs times (after one warm-up) and prints the median
# wall time and the median CPU time (user+system, children included; GNU time's
# resolution is 10 ms) in ms. The CPU time tells more than the wall time on a
# busy machine.
measure() {
	"$@" >/dev/null 2>&1 || { echo "command failed: $*" >&2; "$@"; exit 1; }
	local out="$work/times"
	: >"$out"
	for _ in $(seq "$runs"); do
		local t0 t1 cpu
		t0=$(date +%s%N)
		/usr/bin/time -f '%U %S' -o "$work/cpu" "$@" >/dev/null 2>&1
		cpu=$(tail -1 "$work/cpu")
		t1=$(date +%s%N)
		echo "$(((t1 - t0) / 1000)) $cpu" >>"$out"
	done
	awk '{w[NR] = $1 / 1000; c[NR] = ($2 + $3) * 1000}
		function med(a, n,   i, j, t) {
			for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
			return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
		}
		END { printf "%.2f %.1f\n", med(w, NR), med(c, NR) }' "$out"
}

if [ ! -x /usr/bin/time ]; then
	echo "installing GNU time..." >&2
	apt-get install -y -qq time >&2
fi

read -r gear_true gear_true_cpu < <(measure "$work/gearrun" -np "$np" /bin/true)
read -r mpi_true mpi_true_cpu < <(measure mpirun "${mpiflags[@]}" -np "$np" /bin/true)
read -r gear_hello gear_hello_cpu < <(measure "$work/gearrun" -np "$np" "$work/hello")
read -r mpi_hello mpi_hello_cpu < <(measure mpirun "${mpiflags[@]}" -np "$np" "$work/mpi_hello")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
echo "launch time, median of $runs runs, -np $np, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-28s %11s %11s %7s %8s  %s\n' case "gearrun ms" "mpirun ms" ratio target "(CPU ms gearrun/mpirun, ratio)"
printf '%-28s %11s %11s %7s %8s  %s\n' "/bin/true" "$gear_true" "$mpi_true" "$(ratio "$gear_true" "$mpi_true")" "<= 0.25" \
	"($gear_true_cpu/$mpi_true_cpu, $(ratio "$gear_true_cpu" "$mpi_true_cpu"))"
printf '%-28s %11s %11s %7s %8s  %s\n' "hello (rendezvous+barrier)" "$gear_hello" "$mpi_hello" "$(ratio "$gear_hello" "$mpi_hello")" "<= 0.5" \
	"($gear_hello_cpu/$mpi_hello_cpu, $(ratio "$gear_hello_cpu" "$mpi_hello_cpu"))"
