#!/usr/bin/env bash
# slurm-local.sh brings up and tears down a one-node SLURM cluster on this machine,
# from Debian's packages (apt-get install slurm-wlm munge), so that gear's SLURM
# mode can be tried and tested without a real cluster.
#
#   scripts/slurm-local.sh up       # munged, slurmctld and slurmd; waits for the node
#   eval "$(scripts/slurm-local.sh env)"   # point sbatch/squeue/... at it
#   scripts/slurm-local.sh status   # daemons and sinfo
#   scripts/slurm-local.sh down     # stops the daemons this script started
#
# Everything (munge key and socket, slurm.conf, state, spool and logs) lives under
# one directory, $GEAR_SLURM_DIR (default: /tmp/gear-slurm-$UID). Nothing under
# /etc is touched, so the clients find the cluster through SLURM_CONF, which `env`
# prints. The node is this host with its real CPU count and memory; accounting is
# off (no slurmdbd), and finished jobs stay visible to `scontrol show job` for
# MinJobAge seconds (a day), which is how `gearrun status` sees COMPLETED, FAILED
# and CANCELLED without sacct.
#
# Run it as root, or as a user for that user's own jobs (slurmd then runs as
# that user and can start no one else's jobs).
#
# Settings (environment): GEAR_SLURM_DIR, GEAR_SLURM_CTLD_PORT (default 6817),
# GEAR_SLURM_SLURMD_PORT (default 6818), GEAR_SLURM_UP_TIMEOUT (seconds, default 60).
set -euo pipefail

dir=${GEAR_SLURM_DIR:-/tmp/gear-slurm-$(id -u)}
ctld_port=${GEAR_SLURM_CTLD_PORT:-6817}
slurmd_port=${GEAR_SLURM_SLURMD_PORT:-6818}
up_timeout=${GEAR_SLURM_UP_TIMEOUT:-60}

conf=$dir/etc/slurm.conf
munge_socket=$dir/munge/munge.socket.2
munge_pid=$dir/munge/munged.pid
ctld_pid=$dir/run/slurmctld.pid
slurmd_pid=$dir/run/slurmd.pid

log() { printf 'slurm-local: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

need() {
	local missing=()
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || missing+=("$c")
	done
	if ((${#missing[@]})); then
		die "missing ${missing[*]}; install them with: apt-get install -y slurm-wlm munge"
	fi
}

# alive PIDFILE: the pid in PIDFILE names a running process.
alive() {
	local pid
	[[ -s $1 ]] || return 1
	pid=$(<"$1")
	[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null
}

# stop NAME PIDFILE: TERM the process named in PIDFILE, then KILL after 10 s.
stop() {
	local name=$1 pidfile=$2 pid i
	if ! alive "$pidfile"; then
		rm -f "$pidfile"
		return 0
	fi
	pid=$(<"$pidfile")
	log "stopping $name (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "$name (pid $pid) ignored TERM; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$pidfile"
}

mem_mb() {
	# MemTotal in MiB, less 5% (slurmd refuses a node that claims more than it has).
	awk '/^MemTotal:/ { printf "%d\n", $2 / 1024 * 0.95 }' /proc/meminfo
}

# node_name is the node's name in SLURM, which is what SLURM_JOB_NODELIST lists
# and ranks dial for the rendezvous: this host's short name when it resolves,
# else localhost.
node_name() {
	local host
	host=$(hostname -s)
	if getent hosts "$host" >/dev/null 2>&1; then
		echo "$host"
	else
		echo localhost
	fi
}

write_conf() {
	local host node user cpus mem
	host=$(hostname -s)
	node=$(node_name)
	user=$(id -un)
	cpus=$(nproc --all)
	mem=$(mem_mb)
	cat >"$conf" <<EOF
# Written by scripts/slurm-local.sh: a one-node cluster on $host.
ClusterName=gearlocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket

StateSaveLocation=$dir/state/ctld
SlurmdSpoolDir=$dir/state/slurmd
SlurmctldPidFile=$ctld_pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups: processes are tracked through /proc, so cancel reaches every
# descendant of a task that stays in its session.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none

# No accounting daemon. Finished jobs stay in slurmctld (scontrol show job) for a day.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=86400

SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
InactiveLimit=0
SlurmdTimeout=300
SlurmctldTimeout=120
SlurmdParameters=config_overrides

NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

print_env() {
	printf 'export SLURM_CONF=%q\n' "$conf"
}

cmd_up() {
	need munged mungekey slurmctld slurmd sinfo scontrol
	mkdir -p "$dir"/{etc,munge,run,log,state/ctld,state/slurmd}
	chmod 0755 "$dir" "$dir"/{etc,run,log,state}
	chmod 0700 "$dir/munge" "$dir/state/ctld" "$dir/state/slurmd"
	write_conf
	export SLURM_CONF=$conf

	if ! alive "$munge_pid"; then
		if [[ ! -s $dir/munge/munge.key ]]; then
			mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
			chmod 0600 "$dir/munge/munge.key"
		fi
		log "starting munged"
		munged --force \
			--key-file="$dir/munge/munge.key" \
			--socket="$munge_socket" \
			--pid-file="$munge_pid" \
			--log-file="$dir/log/munged.log" \
			--seed-file="$dir/munge/munged.seed"
	fi
	if ! alive "$ctld_pid"; then
		log "starting slurmctld"
		# -i: ignore state from an earlier run whose configuration differs.
		slurmctld -f "$conf" -i
	fi
	if ! alive "$slurmd_pid"; then
		log "starting slurmd"
		slurmd -f "$conf" -N "$(node_name)"
	fi

	local host i state
	host=$(node_name)
	for ((i = 0; i < up_timeout * 2; i++)); do
		state=$(sinfo -h -n "$host" -o '%t' 2>/dev/null || true)
		case $state in
		idle* | mix* | alloc*)
			log "up: node $host is $state"
			print_env
			return 0
			;;
		down* | drain* | drng*)
			# A node left down by an earlier run: bring it back.
			scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
			;;
		esac
		sleep 0.5
	done
	log "node $host did not become idle within ${up_timeout}s (state: ${state:-unknown}); logs:"
	tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
	exit 1
}

cmd_down() {
	stop slurmd "$slurmd_pid"
	stop slurmctld "$ctld_pid"
	stop munged "$munge_pid"
	log "down"
}

cmd_status() {
	local rc=0
	for p in "munged:$munge_pid" "slurmctld:$ctld_pid" "slurmd:$slurmd_pid"; do
		if alive "${p#*:}"; then
			printf '%-10s running (pid %s)\n' "${p%%:*}" "$(<"${p#*:}")"
		else
			printf '%-10s stopped\n' "${p%%:*}"
			rc=1
		fi
	done
	if ((rc == 0)); then
		SLURM_CONF=$conf sinfo || rc=1
	fi
	return $rc
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
env) print_env ;;
*)
	echo "usage: $0 up|down|status|env" >&2
	exit 2
	;;
esac
