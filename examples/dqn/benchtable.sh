#!/bin/sh
# benchtable.sh: the DQN scaling table with K, environments per actor.
#
# Builds gearrun and dqn, then runs `dqn --bench` under gearrun (one trainer,
# ACTORS actors, and one policy worker unless inline) for every configuration
# of CONFIGS, ROUNDS times in turn (round 1: every configuration; round 2: the
# same again; ...), so that a noisy machine weighs on all of them alike. A
# configuration is MODE:K, MODE one of
#
#   inline  actors run the policy themselves
#   shm     one policy worker, shared memory (actors and trainer on one host)
#   tcp     one policy worker, every stream over TCP (--tcp)
#
# and K the --envs-per-actor of the actors. The table gives, per configuration,
# the median frames/s over the rounds and the median of each round's ratio to
# the round's first configuration (inline:1 by default). Raw lines go to $OUT.
#
#   examples/dqn/benchtable.sh
#   CONFIGS="inline:1 shm:1 shm:16" ROUNDS=5 BENCH=10s examples/dqn/benchtable.sh
set -eu

CONFIGS=${CONFIGS:-inline:1 shm:1 shm:4 shm:16 shm:64 tcp:1 tcp:16 inline:16}
ROUNDS=${ROUNDS:-3}
ACTORS=${ACTORS:-4}
BENCH=${BENCH:-4s}
WARMUP=${WARMUP:-2s}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gear-dqn-bench.XXXXXX")}
mkdir -p "$OUT"
BIN=$(mktemp -d "${TMPDIR:-/tmp}/gear-dqn-bin.XXXXXX")
trap 'rm -rf "$BIN"' EXIT

(cd "$ROOT" && go build -o "$BIN/gearrun" ./cmd/gearrun && go build -o "$BIN/dqn" ./examples/dqn)

# run MODE K ROUND: one measurement; appends "MODE:K ROUND FRAMES/S" to $OUT/results.
run() {
	mode=$1 k=$2 round=$3
	trainer="-np 1 $BIN/dqn --role trainer --bench $BENCH --bench-warmup $WARMUP --envs-per-actor $k"
	policy=": -np 1 $BIN/dqn --role policy"
	case $mode in
	inline) policy= ;;
	tcp) trainer="$trainer --tcp" ;;
	shm) ;;
	*) echo "benchtable.sh: configuration $mode:$k: want inline, shm or tcp" >&2; exit 2 ;;
	esac
	log=$OUT/$mode-$k-$round.log
	# shellcheck disable=SC2086 # the words are the command line
	if ! "$BIN/gearrun" $trainer $policy : -np "$ACTORS" "$BIN/dqn" --role actor >"$log" 2>&1; then
		echo "benchtable.sh: $mode:$k round $round failed, see $log" >&2
		exit 1
	fi
	fps=$(sed -n 's/.*dqn: bench: .*: \([0-9]*\) frames\/s.*/\1/p' "$log")
	echo "$mode:$k $round ${fps:?no bench line in $log}" >>"$OUT/results"
	echo "round $round  $mode:$k  $fps frames/s" >&2
}

: >"$OUT/results"
for round in $(seq "$ROUNDS"); do
	for c in $CONFIGS; do
		run "${c%%:*}" "${c#*:}" "$round"
	done
done

echo "$ACTORS actors, --bench $BENCH --bench-warmup $WARMUP, $ROUNDS rounds; load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
echo
echo "| mode | K | frames/s (median) | rounds | ratio to ${CONFIGS%% *} (median of rounds) |"
echo "|---|---|---|---|---|"
base=${CONFIGS%% *}
for c in $CONFIGS; do
	awk -v c="$c" -v base="$base" '
		$1 == base { b[$2] = $3 }
		$1 == c { v[$2] = $3; n++ }
		function median(a, k,   i, j, t, m, s) {
			m = 0
			for (i in a) s[++m] = a[i]
			for (i = 2; i <= m; i++) for (j = i; j > 1 && s[j-1] > s[j]; j--) { t = s[j]; s[j] = s[j-1]; s[j-1] = t }
			return m % 2 ? s[(m+1)/2] : (s[m/2] + s[m/2+1]) / 2
		}
		END {
			rounds = ""
			for (r = 1; r <= n; r++) { rounds = rounds (r == 1 ? "" : " ") v[r]; ratio[r] = v[r] / b[r] }
			split(c, mk, ":")
			printf "| %s | %s | %.0f | %s | %.2f |\n", mk[1], mk[2], median(v), rounds, median(ratio)
		}' "$OUT/results"
done
echo
echo "raw: $OUT"
