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
#         on the loopback interface (MPI_TCP_IF, default lo: Open MPI's TCP
#         BTL otherwise tries every interface, and fails on one it cannot bind)
#
# Both programs time the same way (see mpi_allreduce.c). For every size the
# table gives each side's median round (the round's time is the program's own
# median of ITERS calls), and the best round's ratio beside it. Raw JSON lines go
# to $OUT.
#
# The wall time of every program run (start to exit, setup included) is
# recorded too; the "wall" table gives each side's median per np and transport.
#
# LIMIT=S bounds every program run to S seconds of wall time (timeout(1), 0:
# none): a run stopped there keeps the sizes it finished, and its wall time
# shows in the table as "> S".
#
# GEAR_ARGS adds flags to every gearbench run; with GEAR_ARGS=--memcpy every
# rank also times a plain copy of each size, and the table gains a column:
# gear's bus bandwidth as a fraction of that copy's (median round).
#
# BUSY=K starts K busy loops (shell processes that never sleep) before the
# first round and stops them after the last, so that both sides run beside
# other work sharing the cores.
#
#   bench/peers/allreduce.sh                     # sizes 8,1K,64K,1M,16M,64M
#   SIZES=8,1K,1M ROUNDS=5 NPS="2 4" TRANSPORTS=tcp bench/peers/allreduce.sh
#   SIZES=8,64K ROUNDS=3 ITERS=5 NPS="32 64 128" TRANSPORTS=shm bench/peers/allreduce.sh
#   SIZES=8 ITERS=10 ROUNDS=3 NPS=128 TRANSPORTS=shm bench/peers/allreduce.sh   # wall table: whole programs
#   BUSY=2 SIZES=8,64K,1M NPS=2 bench/peers/allreduce.sh
set -eu

SIZES=${SIZES:-8,1K,64K,1M,16M,64M}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-20}
NPS=${NPS:-2 4}
TRANSPORTS=${TRANSPORTS:-shm tcp}
MPI_TCP_IF=${MPI_TCP_IF:-lo}
BUSY=${BUSY:-0}
LIMIT=${LIMIT:-0}
GEAR_ARGS=${GEAR_ARGS:-}
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

busy_pids=
stop_busy() { for p in $busy_pids; do kill "$p" 2>/dev/null || true; done; busy_pids=; }
trap stop_busy EXIT
trap 'stop_busy; exit 130' INT TERM
for _ in $(seq 1 "$BUSY"); do
	sh -c 'while :; do :; done' &
	busy_pids="$busy_pids $!"
done
[ "$BUSY" -gt 0 ] && echo "allreduce.sh: $BUSY busy processes:$busy_pids" >&2

now() { date +%s.%N; }
# bounded runs a program under LIMIT with its output in the file $1; it prints
# "unfinished" when LIMIT stopped it, and fails as the program does otherwise.
bounded() {
	out=$1
	shift
	if [ "$LIMIT" -le 0 ]; then
		"$@" >"$out"
		return
	fi
	rc=0
	timeout -k 10 "$LIMIT" "$@" >"$out" || rc=$?
	case $rc in
	0) ;;
	124 | 137) echo unfinished; echo "allreduce.sh: stopped after $LIMIT s: $*" >&2 ;;
	*) return $rc ;;
	esac
}
for round in $(seq 1 "$ROUNDS"); do
	for np in $NPS; do
		over=
		[ "$np" -gt "$CORES" ] && over=--oversubscribe
		for tr in $TRANSPORTS; do
			case $tr in
			shm) gearenv= mca= ;;
			tcp) gearenv=GEAR_TRANSPORT=tcp mca="--mca btl tcp,self --mca btl_tcp_if_include $MPI_TCP_IF" ;;
			*) echo "allreduce.sh: unknown transport $tr (want shm or tcp)" >&2; exit 2 ;;
			esac
			echo "allreduce.sh: round $round, np $np, $tr" >&2
			t0=$(now)
			gs=$(bounded "$OUT/gear.$tr.np$np.r$round.jsonl" \
				env $gearenv "$OUT/gearrun" --tag-output=false -np "$np" "$OUT/gearbench" allreduce --sizes "$SIZES" --iters "$ITERS" --json $GEAR_ARGS)
			t1=$(now)
			ms=$(bounded "$OUT/mpi.$tr.np$np.r$round.jsonl" \
				$MPIRUN $over $mca -np "$np" "$OUT/mpi_allreduce" --sizes "$SIZES" --iters "$ITERS" --json)
			t2=$(now)
			echo "gear $tr $np $(echo "$t1 - $t0" | bc) $gs" >>"$OUT/wall.txt"
			echo "mpi $tr $np $(echo "$t2 - $t1" | bc) $ms" >>"$OUT/wall.txt"
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
		sub(/^"[a-z_]+":/, "", m)
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
	r = field($0, "busbw_per_memcpy")
	if (who == "gear" && r >= 0) { cr = ++rcnt[k]; rat[k, cr] = r; anyr = 1 }
}
function medr(k,    c, i, j, t, a) {
	c = rcnt[k]
	for (i = 1; i <= c; i++) a[i] = rat[k, i]
	for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return (c % 2) ? a[(c+1)/2] : (a[c/2] + a[c/2+1]) / 2
}
function med(who, k,    c, i, j, t, a) {
	c = cnt[who, k]
	for (i = 1; i <= c; i++) a[i] = sec[who, k, i]
	for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return (c % 2) ? a[(c+1)/2] : (a[c/2] + a[c/2+1]) / 2
}
function busbw(np, b, s) { return (s > 0) ? 2 * (np - 1) / np * b / s : 0 }
END {
	printf "%4s %3s %10s %12s %12s %12s %12s %9s %9s%s\n", "tr", "np", "bytes", "gear us", "mpi us", "gear busbw", "mpi busbw", "time g/m", "best g/m", anyr ? "  g busbw/memcpy" : ""
	for (i = 1; i <= n; i++) {
		k = order[i]
		g = med("gear", k); m = med("mpi", k)
		rt = (m > 0) ? g / m : 0
		rb = (best["mpi", k] > 0) ? best["gear", k] / best["mpi", k] : 0
		printf "%4s %3d %10d %12.3f %12.3f %10.2fGB %10.2fGB %9.2f %9.2f%s\n", trs[k], nps[k], bytes[k], g * 1e6, m * 1e6, busbw(nps[k], bytes[k], g) / 1e9, busbw(nps[k], bytes[k], m) / 1e9, rt, rb, (rcnt[k] > 0) ? sprintf("  %15.2f", medr(k)) : ""
	}
}'
stop_busy

# Whole programs: each side's median wall time per transport and np.
awk '
{ k = $2 SUBSEP $3; if (!(k in seen)) { seen[k] = 1; order[++n] = k }; c = ++cnt[$1, k]; w[$1, k, c] = $4; if ($5 == "unfinished") un[$1, k] = 1 }
function med(who, k,    c, i, j, t, a) {
	c = cnt[who, k]
	for (i = 1; i <= c; i++) a[i] = w[who, k, i]
	for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return (c % 2) ? a[(c+1)/2] : (a[c/2] + a[c/2+1]) / 2
}
END {
	printf "%4s %3s %12s %12s %9s   (wall time of the whole program, median of rounds)\n", "tr", "np", "gear s", "mpi s", "g/m"
	for (i = 1; i <= n; i++) {
		k = order[i]; split(k, p, SUBSEP)
		g = med("gear", k); m = med("mpi", k)
		gs = sprintf("%.2f", g); ms = sprintf("%.2f", m)
		if (("gear", k) in un) gs = "> " limit
		if (("mpi", k) in un) ms = "> " limit
		printf "%4s %3d %12s %12s %9s\n", p[1], p[2], gs, ms, (("gear", k) in un || ("mpi", k) in un) ? "-" : sprintf("%.2f", (m > 0) ? g / m : 0)
	}
}' limit="$LIMIT" "$OUT/wall.txt"
echo "allreduce.sh: raw results in $OUT" >&2
