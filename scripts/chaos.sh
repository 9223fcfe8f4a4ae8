#!/usr/bin/env bash
# chaos.sh runs a job with restarts and, at moments drawn from a seed, does
# it harm: SIGKILL of a random rank, SIGSTOP of a random rank for longer than
# the heartbeat timeout (then SIGCONT), and with --slurm the loss of a whole
# node of the local cluster (scripts/slurm-local.sh up --nodes N: every
# process of its network namespace, slurmd included, killed; brought back up
# at the end). After each event and at the end it checks the invariants of
# docs/elastic.md:
#
#   rows      no committed row is lost by the restart: the rows the trainer
#             last reported before the event (its table's size, or for a
#             lost node its last shard checkpoint) are all in the shard that
#             the next generation re-attaches or restores;
#   versions  parameter versions never go back: each generation resumes a
#             version at least the last one's and publishes above it;
#   exit      the job exits 0 while the restart budget holds, and with the
#             failing rank's code (non-zero) once it is spent;
#   procs     no process of the job (of an ended generation, then of the job)
#             survives it;
#   shm       /dev/shm holds nothing of the job afterwards (the nodes of the
#             local cluster share this machine's /dev/shm, the node left out
#             included);
#   expect    with --expect RE, the job printed a line matching RE (for the
#             DQN jobs: "dqn: solved");
#   events    all N events happened before the job ended, and each restart
#             was one event's (none a false loss).
#
# It prints a line per event and a verdict last, and exits 0 only when every
# invariant held (1 otherwise, 2 for a usage error).
#
#   scripts/chaos.sh --seed 7 --events 5 --expect 'dqn: solved' examples/jobs/dqn-elastic.toml
#   scripts/chaos.sh --slurm --seed 7 --events 5 examples/jobs/dqn-elastic-3n.toml
#
# Settings (environment): GEARRUN (a built gearrun; default: built from the
# repository into the work directory), CHAOS_DIR (the work directory, kept:
# the job's output is CHAOS_DIR/output.log; default a new one under $TMPDIR),
# CHAOS_GAP (each event comes [GAP, 2*GAP) seconds, in tenths, after the
# generation's first report, default 1: room for 5 events before the DQN
# jobs solve), CHAOS_WAIT (seconds to wait for a restart, default 120).
set -uo pipefail

usage() { echo "usage: scripts/chaos.sh [--slurm] --seed S --events N [--expect RE] JOBSPEC" >&2; exit 2; }

slurm=0 seed= events= expect= spec=
while (($#)); do
	case $1 in
	--slurm) slurm=1 ;;
	--seed) seed=${2:-}; shift ;;
	--events) events=${2:-}; shift ;;
	--expect) expect=${2:-}; shift ;;
	-h | --help) usage ;;
	-*) echo "chaos: unknown flag $1" >&2; usage ;;
	*) [[ -z $spec ]] || usage; spec=$1 ;;
	esac
	shift
done
[[ $seed =~ ^[0-9]+$ && $events =~ ^[0-9]+$ && -f $spec ]] || usage

root=$(cd "$(dirname "$0")/.." && pwd)
work=${CHAOS_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gear-chaos.XXXXXX")}
mkdir -p "$work"
out=$work/output.log
gap=${CHAOS_GAP:-1}
restart_wait=${CHAOS_WAIT:-120}
gearrun=${GEARRUN:-}
if [[ -z $gearrun ]]; then
	gearrun=$work/gearrun
	(cd "$root" && go build -o "$gearrun" ./cmd/gearrun) || { echo "chaos: cannot build gearrun" >&2; exit 1; }
fi

# The spec's restart budget and heartbeat timeout (seconds; 6 by default,
# rank.DefaultHeartbeatTimeout).
restarts=$(sed -n 's/^restarts *= *\([0-9]*\).*/\1/p' "$spec" | head -1)
restarts=${restarts:-0}
hb=$(sed -n 's/^heartbeat_timeout *= *"\([0-9.]*\)s".*/\1/p' "$spec" | head -1)
hb=${hb:-6}
stop_for=$(awk -v h="$hb" 'BEGIN { printf "%d", h + 4 }')

RANDOM=$seed
failures=0
t0=$(date +%s)
say() { printf 'chaos: %4ds %s\n' "$(($(date +%s) - t0))" "$*"; }
bad() { failures=$((failures + 1)); say "FAIL: $*"; }

# envof PID NAME prints NAME's value in process PID's environment.
envof() { { tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null | sed -n "s/^$2=//p" | head -1; }

# jobprocs prints the PIDs of every process whose environment names the job
# (the ranks, and under SLURM the tasks that run them), this script aside.
jobprocs() {
	local p
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		[[ $p == "$$" || $p == "$BASHPID" ]] && continue
		[[ $(envof "$p" GEAR_JOB_ID) == "$job" ]] && echo "$p"
	done
}

# ranks prints "PID RANK ROLE" for each rank process of the job.
ranks() {
	local p r
	for p in $(jobprocs); do
		r=$(envof "$p" GEAR_RANK)
		[[ -n $r && $(cat "/proc/$p/comm" 2>/dev/null) != gearrun ]] || continue
		echo "$p $r $(envof "$p" GEAR_ROLE)"
	done
}

restarts_seen() { grep -c 'restart [0-9]* of [0-9]*:' "$out" 2>/dev/null; }
trainer_lines() { grep -c 'dqn: trainer 0 of\|: trainer [0-9]* of [0-9]*: rank' "$out" 2>/dev/null; }
last_table() { grep -o 'table *[0-9]*' "$out" | tail -1 | grep -o '[0-9]*$'; }
last_ckpt_rows() { grep -o 'checkpoint [^ ]*: [0-9]* rows' "$out" | tail -1 | sed 's/.*: \([0-9]*\) rows/\1/'; }

# Start the job.
# The job's checkpoint directory (under $XDG_STATE_HOME) in the work
# directory, not the user's state directory.
export XDG_STATE_HOME=$work/state
if ((slurm)); then
	export GEAR_STATE_DIR=$work/state
	ids=$("$gearrun" submit "$spec" 2>&1) || { echo "chaos: submit: $ids" >&2; exit 1; }
	job=$(grep -Eo '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' <<<"$ids" | head -1)
	slurm_id=$(sed -n 's/^SLURM job ID: *//p' <<<"$ids")
	ln -sf "$GEAR_STATE_DIR/jobs/$job/output.log" "$out"
	say "submitted job $job (SLURM job $slurm_id)"
	# The batch host runs gearrun itself: its loss ends the job, as SLURM's
	# does, so no node event takes it. Another node may go down while the
	# nodes left hold the job: ntasks_per_node each (else the first world's
	# share), at least min_np ranks, else every rank.
	for _ in $(seq 300); do
		batch=$(scontrol show job "$slurm_id" 2>/dev/null | grep -o 'BatchHost=[^ ]*' | cut -d= -f2)
		[[ -n $batch && $batch != "(null)" ]] && break
		sleep 0.2
	done
	batch_ns=gearslurm-$batch
	nodes=$(sed -n '/^\[slurm\]/,/^\[/s/^nodes *= *\([0-9]*\).*/\1/p' "$spec" | head -1)
	nodes=${nodes:-1}
	world=$(sed -n 's/^np *= *\([0-9]*\).*/\1/p' "$spec" | awk '{ n += $1 } END { print n + 0 }')
	per_node=$(sed -n 's/^ntasks_per_node *= *\([0-9]*\).*/\1/p' "$spec" | head -1)
	per_node=${per_node:-$(((world + nodes - 1) / nodes))}
	need=$(sed -n 's/^min_np *= *\([0-9]*\).*/\1/p' "$spec" | head -1)
	need=${need:-$world}
	say "batch host $batch; $nodes nodes of $per_node ranks, $need ranks needed"
else
	"$gearrun" run "$spec" >"$out" 2>&1 &
	gpid=$!
	job=
	for _ in $(seq 300); do
		for p in $(pgrep -P "$gpid"); do
			job=$(envof "$p" GEAR_JOB_ID)
			[[ -n $job ]] && break 2
		done
		sleep 0.2
	done
	say "job $job: gearrun pid $gpid, restarts $restarts, heartbeat timeout ${hb}s, seed $seed, $events events"
fi
[[ -n $job ]] || { echo "chaos: the job's ranks never started; see $out" >&2; exit 1; }

# running says whether the job still runs.
running() {
	if ((slurm)); then
		[[ ! -e $GEAR_STATE_DIR/jobs/$job/exit ]]
	else
		kill -0 "$gpid" 2>/dev/null
	fi
}

# wait_world waits until the current generation's trainer reports progress.
wait_world() {
	local gen=$1 i
	for i in $(seq $((restart_wait * 5))); do
		# Looked at before running: a job may have ended by its solve.
		if (($(trainer_lines) > gen)); then
			# a status line of this generation, after its trainer line, or
			# its solve (a generation that solves within its first second
			# prints no status line before it ends the job)
			awk -v g="$gen" '/: trainer [0-9]+ of [0-9]+: rank/ { n++ } n > g && (/episode +[0-9]+ +frames/ || /: solved: /) { found = 1 } END { exit !found }' "$out" && return 0
		fi
		running || return 1
		sleep 0.2
	done
	return 1
}

gen=0
down=0 downed=()
batch_ns=${batch_ns:-}
nodes=${nodes:-1} per_node=${per_node:-1} need=${need:-1}
caused=0 # events that made the world restart
code_expected=0
last_resumed=0
for ev in $(seq "$events"); do
	{ wait_world "$gen" && running; } || { say "event $ev: the job ended or did not come up (generation $gen)"; break; }
	# The moment: [gap, 2*gap) seconds (tenths drawn; [0, 1) for gap 0)
	# after the generation's first report.
	d=$((gap * 10 + RANDOM % (gap > 0 ? gap * 10 : 10)))
	sleep "$((d / 10)).$((d % 10))"
	running || { say "event $ev: the job ended before it"; break; }
	kinds=(kill stop)
	mapfile -t rk < <(ranks)
	((${#rk[@]})) || { say "event $ev: no rank to harm"; break; }
	# A node may go down when one more loss leaves enough slots and a rank
	# runs on a node other than the batch host.
	mapfile -t nrk < <(for l in "${rk[@]}"; do
		ns=$(ip netns identify "${l%% *}" 2>/dev/null)
		[[ -n $ns && $ns != "$batch_ns" ]] && echo "$l"
	done)
	((slurm && ${#nrk[@]} && (nodes - down - 1) * per_node >= need)) && kinds+=(node)
	kind=${kinds[RANDOM % ${#kinds[@]}]}
	if [[ $kind == node ]]; then
		read -r pid rnk role <<<"${nrk[RANDOM % ${#nrk[@]}]}"
	else
		read -r pid rnk role <<<"${rk[RANDOM % ${#rk[@]}]}"
	fi
	old=$(for l in "${rk[@]}"; do echo "${l%% *}"; done)
	rows_before=$(last_table)
	rows_before=${rows_before:-0}
	before=$(restarts_seen)
	case $kind in
	kill)
		what="SIGKILL rank $rnk ($role, pid $pid)"
		kill -KILL "$pid" 2>/dev/null
		;;
	stop)
		what="SIGSTOP rank $rnk ($role, pid $pid) for ${stop_for}s"
		kill -STOP "$pid" 2>/dev/null
		sleep "$stop_for"
		kill -CONT "$pid" 2>/dev/null
		;;
	node)
		node=$(ip netns identify "$pid" 2>/dev/null)
		what="node ${node#gearslurm-} down (rank $rnk, $role)"
		# A trainer lost with its node resumes its last shard checkpoint.
		for l in "${rk[@]}"; do
			read -r p _ r <<<"$l"
			if [[ $r == trainer && $(ip netns identify "$p" 2>/dev/null) == "$node" ]]; then
				rows_before=$(last_ckpt_rows)
				rows_before=${rows_before:-0}
			fi
		done
		for p in $(ip netns pids "$node" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
		down=$((down + 1))
		downed+=("${node#gearslurm-}")
		;;
	esac
	caused=$((caused + 1))
	if ((caused > restarts)); then
		code_expected=nonzero
		say "event $ev: $what: the restart budget ($restarts) is spent"
		break
	fi
	# The next generation: a restart line, then its trainer's report.
	ok=1
	for _ in $(seq $((restart_wait * 5))); do
		(($(restarts_seen) > before)) && break
		running || break
		sleep 0.2
	done
	if (($(restarts_seen) <= before)); then
		if ! running; then
			# The job ended (solved) before the harm was noticed: the event
			# made no restart and does not count.
			caused=$((caused - 1))
			say "event $ev: $what: the job ended before a restart"
			break
		fi
		bad "event $ev: $what: no restart within ${restart_wait}s"
		break
	fi
	gen=$((gen + 1))
	wait_world "$gen" || { bad "event $ev: $what: generation $gen never reported"; break; }
	rows_after=$(grep 'committed rows' "$out" | tail -1 | grep -o '[0-9]* committed rows' | tail -1 | grep -o '^[0-9]*')
	rows_after=${rows_after:-0}
	if ((rows_after < rows_before)); then
		ok=0
		bad "event $ev: rows: $rows_before before, $rows_after after"
	fi
	resumed=$(grep -o 'parameters of version [0-9]* resumed' "$out" | tail -1 | grep -o '[0-9]*')
	from=$(grep -o 'versions go on from [0-9]*' "$out" | tail -1 | grep -o '[0-9]*$')
	resumed=${resumed:-0} from=${from:-0}
	if ((resumed < last_resumed || from <= resumed)); then
		ok=0
		bad "event $ev: versions: resumed $resumed (last $last_resumed), publishing from $from"
	fi
	last_resumed=$resumed
	left=
	for p in $old; do
		[[ -d /proc/$p && $(envof "$p" GEAR_RESTART_COUNT) == "$((gen - 1))" ]] && left+=" $p"
	done
	if [[ -n $left ]]; then
		ok=0
		bad "event $ev: processes of generation $((gen - 1)) survive:$left"
	fi
	((ok)) && say "event $ev: $what: restart $gen, rows $rows_before -> $rows_after, version $resumed -> from $from: ok"
done

# The end.
if ((slurm)); then
	# The batch script writes the exit file as gearrun ends; SLURM may
	# count the job as COMPLETING long after (until it takes a node that
	# went down for DOWN, SlurmdTimeout).
	for _ in $(seq $((restart_wait * 5))); do
		running || break
		sleep 0.2
	done
	code=$(cat "$GEAR_STATE_DIR/jobs/$job/exit" 2>/dev/null || echo missing)
else
	wait "$gpid"
	code=$?
fi
say "job ended with exit code $code after $caused events"
# Each event restarts the job, but the one that spends the budget.
if (($(restarts_seen) != (caused > restarts ? restarts : caused))); then
	bad "restarts: $(restarts_seen) restarts for $caused events (a loss that no event caused: a false loss?)"
fi
if ((caused < events)); then
	bad "events: $caused of $events happened before the job ended (a smaller CHAOS_GAP leaves room for more)"
fi
if [[ $code_expected == 0 && $code != 0 ]]; then
	bad "exit: $code, want 0 (restarts used $caused of $restarts)"
elif [[ $code_expected == nonzero && $code == 0 ]]; then
	bad "exit: 0, want the failing rank's code (more events than the $restarts restarts)"
fi
sleep 1
left=$(jobprocs | tr '\n' ' ')
if [[ -n $left ]]; then
	bad "procs: processes of the job survive: $left"
	for p in $left; do kill -KILL "$p" 2>/dev/null; done
fi
segs=$(ls /dev/shm 2>/dev/null | grep -F "gear.$job." | tr '\n' ' ')
if [[ -n $segs ]]; then
	bad "shm: segments of the job left: $segs"
	for s in $segs; do rm -f "/dev/shm/$s"; done
fi
if ((slurm)); then
	# The sweep ran on every node of the allocation at the start and at
	# the end (gearrun: sweep of NODE: ...), a node that went down aside,
	# whose end sweep fails (its slurmd is gone) and which was swept at the
	# start. The nodes share this machine's /dev/shm, checked above.
	alloc=$(sed -n 's/.* ranks on \([^ ]*\), rendezvous at .*/\1/p' "$out" | head -1 | tr , ' ')
	for n in $alloc; do
		swept=$(grep -c "gearrun: sweep of $n: removed" "$out")
		if [[ " ${downed[*]} " == *" $n "* ]]; then
			if ((swept < 1)) || ! grep -q "sweep of node $n at the job's end failed" "$out"; then
				bad "sweep: node $n (down): $swept sweeps, want the start's and a failed end"
			fi
		elif ((swept < 2)); then
			bad "sweep: node $n: $swept sweeps, want 2 (the job's start and end)"
		fi
	done
	say "sweep: $(grep -o 'gearrun: sweep of [^:]*: removed [0-9]* segments' "$out" | sed 's/gearrun: sweep of //' | paste -sd ';' -)"
fi
# The nodes taken down come back (their slurmd started again in their
# namespace, their state resumed), so that the next run has the whole
# cluster: scripts/slurm-local.sh up starts only what is not running.
if ((slurm && down > 0)); then
	all=$(sinfo -h -N -o %N 2>/dev/null | sort -u | wc -l)
	if "$root/scripts/slurm-local.sh" up --nodes "$all" >"$work/revive.log" 2>&1; then
		say "nodes ${downed[*]} back up (scripts/slurm-local.sh up)"
	else
		bad "revive: nodes ${downed[*]} did not come back; see $work/revive.log"
	fi
fi
if [[ -n $expect ]] && ! grep -Eq "$expect" "$out"; then
	bad "expect: no line matching '$expect' (output: $out)"
fi
solved=$(grep -o 'dqn: solved: .*' "$out" | tail -1)
if ((failures == 0)); then
	say "verdict: PASS: seed $seed, $caused events, exit $code, ${solved:-no solved line}"
	exit 0
fi
say "verdict: FAIL: seed $seed, $failures invariants broken; output in $out"
exit 1
