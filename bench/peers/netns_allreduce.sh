#!/bin/sh
# netns_allreduce.sh: gear's AllReduce across two "hosts" on this machine: two
# network namespaces in 10.237.N.0/24 with 2 ranks in each, joined by one veth
# pair (TOPO=veth, the default: two hosts cabled back to back) or each by a
# veth pair to a bridge in a third namespace (TOPO=bridge: a switch between
# them, which costs this machine's CPUs a second pass through the stack per
# packet). It compares the hierarchical AllReduce (shared memory within a
# namespace, TCP across; gear's default) with flat TCP between all four ranks
# (GEAR_TRANSPORT=tcp), and with np=2 over loopback TCP in the root namespace
# (the 8-byte latency reference), ROUNDS times in turn, and prints each one's
# median round per size.
#
# With a C compiler (cc) it also measures the floor of the 8-byte case:
# bench/peers/hier_floor.c does the same three steps (shared memory, one TCP
# swap between the two leaders, shared memory) and nothing else, with the same
# waits, beside its own np=2 loopback swap ("C floor" columns; FLOOR=0 skips it).
#
# Needs root (ip netns add) and iproute2; removes its namespaces on exit.
#
#   bench/peers/netns_allreduce.sh                 # sizes 8,1K,64K,256K,1M,16M,64M
#   SIZES=8,64K ROUNDS=3 TOPO=bridge bench/peers/netns_allreduce.sh
#   ARGS="--small 64K" bench/peers/netns_allreduce.sh   # gearbench tuning flags
set -eu

SIZES=${SIZES:-8,1K,64K,256K,1M,16M,64M}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-20}
ARGS=${ARGS:-}
TOPO=${TOPO:-veth}
FLOOR=${FLOOR:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gear-netns.XXXXXX")}
mkdir -p "$OUT"

if [ "$(id -u)" -ne 0 ]; then
	echo "netns_allreduce.sh: needs root to create network namespaces" >&2
	exit 2
fi
command -v ip >/dev/null 2>&1 || { echo "netns_allreduce.sh: needs ip (iproute2)" >&2; exit 2; }
case $TOPO in veth | bridge) ;; *) echo "netns_allreduce.sh: TOPO is veth or bridge, not $TOPO" >&2; exit 2 ;; esac

echo "netns_allreduce.sh: building into $OUT" >&2
(cd "$ROOT" && go build -o "$OUT/gearbench" ./cmd/gearbench && go build -o "$OUT/gearrun" ./cmd/gearrun)
if [ "$FLOOR" = 1 ] && command -v cc >/dev/null 2>&1; then
	cc -O2 -o "$OUT/hier_floor" "$ROOT/bench/peers/hier_floor.c"
else
	FLOOR=0
fi

id=$$
net=10.237.$((id % 250))
A=gearbenchA$id B=gearbenchB$id S=gearbenchS$id
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; ip netns del "$S" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
ip netns add "$A"
ip netns add "$B"
if [ "$TOPO" = veth ]; then
	ip link add "vA$id" type veth peer name "vB$id"
	ip link set "vA$id" netns "$A"
	ip link set "vB$id" netns "$B"
else
	ip netns add "$S"
	ip -n "$S" link add br0 type bridge
	ip -n "$S" link set br0 up
	# A switch forwards frames without a firewall: where br_netfilter is
	# loaded, bridged frames would otherwise pass through iptables here.
	ip netns exec "$S" sh -c 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ -e "$f" ] && echo 0 >"$f"; done; true'
	for ns in A B; do
		ip link add "v$ns$id" type veth peer name "s$ns$id"
		ip link set "s$ns$id" netns "$S"
		ip -n "$S" link set "s$ns$id" master br0
		ip -n "$S" link set "s$ns$id" up
	done
	ip link set "vA$id" netns "$A"
	ip link set "vB$id" netns "$B"
fi
for ns in A B; do
	eval name=\$$ns
	ip -n "$name" link set "v$ns$id" up
	ip -n "$name" link set lo up
done
ip -n "$A" addr add "$net.1/24" dev "vA$id"
ip -n "$B" addr add "$net.2/24" dev "vB$id"

run() { # run NAME ENV...: one job of 2+2 ranks across the namespaces
	name=$1
	shift
	env "$@" ip netns exec "$A" "$OUT/gearrun" --tag-output=false --rdzv-addr "$net.1:0" \
		-np 2 "$OUT/gearbench" allreduce --sizes "$SIZES" --iters "$ITERS" --json $ARGS \
		: -np 2 ip netns exec "$B" "$OUT/gearbench" allreduce --sizes "$SIZES" --iters "$ITERS" --json $ARGS |
		sed "s/^/$name /"
}

floor() { # the C floor of the 8-byte case: hier_floor's four ranks, then its np=2 loopback swap
	n=200000
	port=$((20000 + id % 20000))
	shmA=gear-floorA$id shmB=gear-floorB$id
	ip netns exec "$A" "$OUT/hier_floor" leader A "$net.1" "$port" "$n" "$shmA" >"$OUT/floor.out" &
	l=$!
	ip netns exec "$A" "$OUT/hier_floor" member A "$n" "$shmA" &
	m=$!
	ip netns exec "$B" "$OUT/hier_floor" leader B "$net.1" "$port" "$n" "$shmB" &
	k=$!
	ip netns exec "$B" "$OUT/hier_floor" member B "$n" "$shmB"
	wait "$l" "$m" "$k"
	rm -f "/dev/shm/$shmA" "/dev/shm/$shmB"
	sed "s/^/chier /" "$OUT/floor.out"
	"$OUT/hier_floor" loop "$n" | sed "s/^/cloop /"
}

for round in $(seq 1 "$ROUNDS"); do
	echo "netns_allreduce.sh: round $round ($TOPO)" >&2
	run hier GEAR_TRANSPORT= >>"$OUT/results"
	run flat GEAR_TRANSPORT=tcp >>"$OUT/results"
	GEAR_TRANSPORT=tcp "$OUT/gearrun" --tag-output=false -np 2 "$OUT/gearbench" allreduce --sizes "$SIZES" --iters "$ITERS" --json $ARGS |
		sed "s/^/loop2 /" >>"$OUT/results"
	if [ "$FLOOR" = 1 ]; then
		floor >>"$OUT/results"
	fi
done

awk '
function field(line, key,    m) {
	if (match(line, "\"" key "\":[-+0-9.eE]+")) {
		m = substr(line, RSTART, RLENGTH)
		sub(/^"[a-z]+":/, "", m)
		return m + 0
	}
	return -1
}
/"op":"allreduce"/ {
	who = $1; b = field($0, "bytes"); s = field($0, "seconds")
	if (who !~ /^c/ && !(b in seen)) { seen[b] = 1; order[++n] = b }
	c = ++cnt[who, b]; sec[who, b, c] = s
}
function med(who, b,    c, i, j, t, a) {
	c = cnt[who, b]
	for (i = 1; i <= c; i++) a[i] = sec[who, b, i]
	for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return (c % 2) ? a[(c+1)/2] : (a[c/2] + a[c/2+1]) / 2
}
END {
	floor = ("chier", 8) in cnt
	printf "%10s %14s %14s %10s %16s %10s", "bytes", "hier us", "flat tcp us", "hier/flat", "loopback np2 us", "hier/loop"
	if (floor) printf " %14s %14s %10s", "C floor hier", "C floor loop", "C ratio"
	printf "\n"
	for (i = 1; i <= n; i++) {
		b = order[i]
		h = med("hier", b); f = med("flat", b); l = med("loop2", b)
		printf "%10d %14.2f %14.2f %10.2f %16.2f %10.2f", b, h * 1e6, f * 1e6, (f > 0) ? h / f : 0, l * 1e6, (l > 0) ? h / l : 0
		if (floor && b == 8) {
			ch = med("chier", b); cl = med("cloop", b)
			printf " %14.2f %14.2f %10.2f", ch * 1e6, cl * 1e6, (cl > 0) ? ch / cl : 0
		}
		printf "\n"
	}
}' "$OUT/results"
echo "netns_allreduce.sh: raw results in $OUT" >&2
