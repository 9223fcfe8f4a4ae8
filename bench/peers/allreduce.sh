#!/bin/sh
# allreduce.sh: gear's AllReduce against Open MPI's MPI_Allreduce on this machine.
#
# Installs Open MPI (openmpi-bin, libopenmpi-dev) with apt-get when mpicc or mpirun
# is missing, builds bench/peers/mpi_allreduce.c with mpicc and gearbench and
# gearrun with go, then runs both under -np 2 and -np 4 (Open MPI oversubscribed
# when there are fewer cores than ranks) with the same sizes, over each transport
# of TRANSPORTS, ROUNDS times in turn (round 1: every np and transport, gear then
# Open MPI; round 2: the same again; ...), and prints a table of the ratios.
#
#   shm   gear's default (shared memory on one host)  against Open MPI's default
#         (its shared-memory BTL, vader)
#   tcp   GEAR_TRANSPORT=tcp                          against mpirun --mca btl tcp,self
#
# Both programs time the same way (see mpi_allreduce.c). For every size the
# table gives each side's median round (the round's time is the program's own
# median of ITERS calls), and the best round's ratio beside it. Raw JSON lines go
# to $OUT.
#
#   bench/peers/allreduce.sh                     # sizes 8,1K,64K,1M,16M,64M
#   SIZES=8,1K,1M ROUNDS=5 NPS="2 4" TRANSPORTS=tcp bench/peers/allreduce.sh
set -eu

SIZES=${SIZES:-8,1K,64K,1M,16M,64M}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-20}
NPS=${NPS:-2 4}
TRANSPORTS=${TRANSPORTS:-shm tcp}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gear-allreduce.XXXXXX")}
mkdir -p "$OUT"

. "$ROOT/bench/peers/openmpi.sh"
need_openmpi

echo "allreduce.sh: building into $OUT" >&2
mpicc -O2 -o "$OUT/mpi_allreduce" "$ROOT/bench/peers/mpi_allreduce.c"
(cd "$ROOT" && go build -o "$OUT/gearbench" ./cmd/gearbench && go build -o "$OUT/gearrun" ./cmd/gearrun)

MPIRUN="mpirun"
[ "$(id -u)" -eq 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
CORES=$(nproc)

for round in $(seq 1 "$ROUNDS"); do
	for np in $NPS; do
		over=
		[ "$np" -gt "$CORES" ] && over=--oversubscribe
		for tr in $TRANSPORTS; do
			case $tr in
			shm) gearenv= mca= ;;
			tcp) gearenv=GEAR_TRANSPORT=tcp mca="--mca btl tcp,self" ;;
			*) echo "allreduce.sh: unknown transport $tr (want shm or tcp)" >&2; exit 2 ;;
			esac
			echo "allreduce.sh: round $round, np $np, $tr" >&2
			env $gearenv "$OUT/gearrun" --tag-output=false -np "$np" "$OUT/gearbench" allreduce --sizes "$SIZES" --iters "$ITERS" --json \
				>"$OUT/gear.$tr.np$np.r$round.jsonl"
			$MPIRUN $over $mca -np "$np" "$OUT/mpi_allreduce" --sizes "$SIZES" --iters "$ITERS" --json \
				>"$OUT/mpi.$tr.np$np.r$round.jsonl"
		done
	done
done

# One table row per transport, np and size: each side's median round.
for tr in $TRANSPORTS; do
	for np in $NPS; do
		for f in "$OUT"/gear.$tr.np$np.r*.jsonl; do sed "s/^/gear $tr /" "$f"; done
		for f in "$OUT"/mpi.$tr.np$np.r*.jsonl; do sed "s/^/mpi $tr /" "$f"; done
	done
done | awk '
function field(line, key,    m) {
	if (match(line, "\"" key "\":[-+0-9.eE]+")) {
		m = substr(line, RSTART, RLENGTH)
		sub(/^"[a-z]+":/, "", m)
		return m + 0
	}
	return -1
}
/"op":"allreduce"/ {
	who = $1; tr = $2; np = field($0, "np"); b = field($0, "bytes"); s = field($0, "seconds"); bw = field($0, "busbw")
	k = tr SUBSEP np SUBSEP b
	if (!(k in seen)) { seen[k] = 1; order[++n] = k }
	c = ++cnt[who, k]; sec[who, k, c] = s
	if (!((who, k) in best) || s < best[who, k]) best[who, k] = s
	bytes[k] = b; nps[k] = np; trs[k] = tr
}
function med(who, k,    c, i, j, t, a) {
	c = cnt[who, k]
	for (i = 1; i <= c; i++) a[i] = sec[who, k, i]
	for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return (c % 2) ? a[(c+1)/2] : (a[c/2] + a[c/2+1]) / 2
}
function busbw(np, b, s) { return (s > 0) ? 2 * (np - 1) / np * b / s : 0 }
END {
	printf "%4s %3s %10s %12s %12s %12s %12s %9s %9s\n", "tr", "np", "bytes", "gear us", "mpi us", "gear busbw", "mpi busbw", "time g/m", "best g/m"
	for (i = 1; i <= n; i++) {
		k = order[i]
		g = med("gear", k); m = med("mpi", k)
		rt = (m > 0) ? g / m : 0
		rb = (best["mpi", k] > 0) ? best["gear", k] / best["mpi", k] : 0
		printf "%4s %3d %10d %12.3f %12.3f %10.2fGB %10.2fGB %9.2f %9.2f\n", trs[k], nps[k], bytes[k], g * 1e6, m * 1e6, busbw(nps[k], bytes[k], g) / 1e9, busbw(nps[k], bytes[k], m) / 1e9, rt, rb
	}
}'
echo "allreduce.sh: raw results in $OUT" >&2
