#!/usr/bin/env bash
# slurm-local.sh brings up and tears down a SLURM cluster on this machine, from
# Debian's packages (apt-get install slurm-wlm munge), so that gear's SLURM mode
# can be tried and tested without a real cluster.
#
#   scripts/slurm-local.sh up              # one node: munged, slurmctld and slurmd
#   scripts/slurm-local.sh up --nodes 3    # three nodes, each in a network namespace
#   eval "$(scripts/slurm-local.sh env)"   # point sbatch/squeue/... at it
#   scripts/slurm-local.sh status          # daemons and sinfo
#   scripts/slurm-local.sh down            # stops the daemons, removes what up made
#
# Everything (munge key and socket, slurm.conf, state, spool and logs) lives under
# one directory, $GEAR_SLURM_DIR (default: /tmp/gear-slurm-$UID). Nothing under
# /etc is touched, so the clients find the cluster through SLURM_CONF, which `env`
# prints. A node gets this host's real CPU count and memory; accounting is
# off (no slurmdbd), and finished jobs stay visible to `scontrol show job` for
# MinJobAge seconds (a day), which is how `gearrun status` sees COMPLETED, FAILED
# and CANCELLED without sacct.
#
# One node (the default) is this host, on loopback. With --nodes N (N > 1) the
# script makes a bridge, gearslurm0, holding 10.251.0.1/24 in this host's
# network namespace (slurmctld listens there), and for node K (1..N) a network
# namespace gearslurm-nK joined to the bridge by a veth pair (gearslurm-vK on
# the bridge, gearslurm-pK inside), where the node has the address
# 10.251.0.(K+1) and its loopback. The node is named nK in SLURM with that
# address as its NodeAddr, and its slurmd runs in its namespace with its own
# spool directory, pid file and log (%n in slurm.conf). Ranks on one node
# share a network namespace, hence a host identity and shared memory; ranks on
# different nodes have different identities and talk TCP over the bridge. The
# names n1..nN resolve nowhere: gearrun reads a node's address from SLURM
# (scontrol show node), so /etc stays untouched. Files, /tmp and /dev/shm are
# shared by the nodes, as on a cluster with a shared file system. The range
# 10.251.0.0/24 and the names gearslurm* belong to this script: down removes
# every namespace, link and daemon of that name that it finds, even after an
# up that failed halfway, and is safe to run twice. A multi-node cluster needs
# root and iproute2 (ip netns).
#
# Run a one-node cluster as root, or as a user for that user's own jobs (slurmd
# then runs as that user and can start no one else's jobs).
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
nodes_file=$dir/run/nodes

# The network of a multi-node cluster: names and a private range that this
# script owns.
bridge=gearslurm0
net_prefix=10.251.0
ns_prefix=gearslurm-n
max_nodes=32

log() { printf 'slurm-local: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

need() {
	local missing=()
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || missing+=("$c")
	done
	if ((${#missing[@]})); then
		die "missing ${missing[*]}; install them with: apt-get install -y slurm-wlm munge iproute2"
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

# node_name is the node's name in a one-node cluster, which is what
# SLURM_JOB_NODELIST lists and ranks dial for the rendezvous: this host's short
# name when it resolves, else localhost.
node_name() {
	local host
	host=$(hostname -s)
	if getent hosts "$host" >/dev/null 2>&1; then
		echo "$host"
	else
		echo localhost
	fi
}

# node_addr K: the address of node K of a multi-node cluster.
node_addr() { echo "$net_prefix.$(($1 + 1))"; }

# running_nodes: the node count of the cluster that runs now (0 when none).
running_nodes() {
	if alive "$ctld_pid" && [[ -s $nodes_file ]]; then
		cat "$nodes_file"
	elif alive "$ctld_pid"; then
		echo 1
	else
		echo 0
	fi
}

# node_names N: the names of the nodes of an N-node cluster, one a line.
node_names() {
	local k
	if (($1 > 1)); then
		for ((k = 1; k <= $1; k++)); do echo "n$k"; done
	else
		node_name
	fi
}

# slurmd_pidfile N K: the pid file of node K's slurmd in an N-node cluster.
slurmd_pidfile() {
	if (($1 > 1)); then
		echo "$dir/run/slurmd-n$2.pid"
	else
		echo "$slurmd_pid"
	fi
}

write_conf() {
	local nodes=$1 host node user cpus mem ctld_addr k
	host=$(hostname -s)
	node=$(node_name)
	user=$(id -un)
	cpus=$(nproc --all)
	mem=$(mem_mb)
	ctld_addr=127.0.0.1
	((nodes == 1)) || ctld_addr=$net_prefix.1
	{
		if ((nodes == 1)); then
			echo "# Written by scripts/slurm-local.sh: a one-node cluster on $host."
		else
			echo "# Written by scripts/slurm-local.sh: a $nodes-node cluster on $host, a network namespace per node."
		fi
		cat <<EOF
ClusterName=gearlocal
SlurmctldHost=$host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket

StateSaveLocation=$dir/state/ctld
SlurmctldPidFile=$ctld_pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
EOF
		if ((nodes == 1)); then
			cat <<EOF
SlurmdSpoolDir=$dir/state/slurmd
SlurmdPidFile=$slurmd_pid
SlurmdLogFile=$dir/log/slurmd.log
EOF
		else
			# %n is the node's name: every slurmd its own spool, pid file and log.
			cat <<EOF
SlurmdSpoolDir=$dir/state/slurmd-%n
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log
EOF
		fi
		cat <<EOF

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

EOF
		if ((nodes == 1)); then
			echo "NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN"
			echo "PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
		else
			for ((k = 1; k <= nodes; k++)); do
				echo "NodeName=n$k NodeHostname=$host NodeAddr=$(node_addr "$k") CPUs=$cpus RealMemory=$mem State=UNKNOWN"
			done
			echo "PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
		fi
	} >"$conf"
}

print_env() {
	printf 'export SLURM_CONF=%q\n' "$conf"
}

# ip_do ARGS...: ip, its complaints shown only when it fails.
ip_do() {
	local out
	if ! out=$(ip "$@" 2>&1); then
		log "ip $*: $out"
		return 1
	fi
}

# net_up N: the bridge, and a namespace and veth pair per node; what exists is kept.
net_up() {
	local nodes=$1 k ns v p addrs
	if ! ip link show "$bridge" >/dev/null 2>&1; then
		log "making bridge $bridge ($net_prefix.1/24)"
		ip_do link add "$bridge" type bridge
	fi
	# (The listings are read whole first: grep -q would close the pipe early,
	# and pipefail would count ip's SIGPIPE as a failure.)
	addrs=$(ip -o addr show dev "$bridge")
	[[ $addrs == *"inet $net_prefix.1/24"* ]] || ip_do addr add "$net_prefix.1/24" dev "$bridge"
	ip_do link set "$bridge" up
	for ((k = 1; k <= nodes; k++)); do
		ns=$ns_prefix$k v=gearslurm-v$k p=gearslurm-p$k
		if [[ ! -e /run/netns/$ns ]]; then
			log "making namespace $ns ($(node_addr "$k"))"
			ip_do netns add "$ns"
		fi
		if ! ip link show "$v" >/dev/null 2>&1; then
			ip -n "$ns" link del "$p" >/dev/null 2>&1 || true
			ip_do link add "$v" type veth peer name "$p"
			ip_do link set "$p" netns "$ns"
		fi
		ip_do link set "$v" master "$bridge"
		ip_do link set "$v" up
		addrs=$(ip -n "$ns" -o addr show dev "$p")
		[[ $addrs == *"inet $(node_addr "$k")/24"* ]] || ip_do -n "$ns" addr add "$(node_addr "$k")/24" dev "$p"
		ip_do -n "$ns" link set "$p" up
		ip_do -n "$ns" link set lo up
	done
}

# our_namespaces: the namespaces of this script that exist.
our_namespaces() {
	ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^$ns_prefix[0-9]+\$" || true
}

# net_down: every process left in our namespaces (what a job of their nodes
# left behind), the namespaces, the veths and the bridge.
net_down() {
	command -v ip >/dev/null 2>&1 || return 0
	local ns pids link i
	for ns in $(our_namespaces); do
		pids=$(ip netns pids "$ns" 2>/dev/null || true)
		if [[ -n $pids ]]; then
			log "killing what is left in $ns: $(echo $pids)"
			kill -KILL $pids 2>/dev/null || true
			for ((i = 0; i < 50; i++)); do
				[[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
				sleep 0.1
			done
		fi
		log "removing namespace $ns"
		ip netns del "$ns" 2>/dev/null || true
	done
	for link in $(ip -o link show 2>/dev/null | awk -F': ' '{ print $2 }' | sed 's/@.*//' | grep -E '^gearslurm-v[0-9]+$' || true); do
		ip link del "$link" 2>/dev/null || true
	done
	if ip link show "$bridge" >/dev/null 2>&1; then
		log "removing bridge $bridge"
		ip link del "$bridge" 2>/dev/null || true
	fi
}

# wait_idle N: wait until every node is idle (or allocated); exit 1 on timeout.
wait_idle() {
	local nodes=$1 i states node state bad
	for ((i = 0; i < up_timeout * 2; i++)); do
		states=$(sinfo -h -N -o '%N %t' 2>/dev/null || true)
		bad=0
		for node in $(node_names "$nodes"); do
			state=$(awk -v n="$node" '$1 == n { print $2; exit }' <<<"$states")
			case $state in
			idle* | mix* | alloc*) ;;
			down* | drain* | drng*)
				# A node left down by an earlier run: bring it back.
				scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
				bad=1
				;;
			*) bad=1 ;;
			esac
		done
		if ((bad == 0)); then
			log "up: $(node_names "$nodes" | paste -sd, -) idle"
			return 0
		fi
		sleep 0.5
	done
	log "the nodes did not become idle within ${up_timeout}s:"
	log "$states"
	tail -n 20 "$dir"/log/slurmctld.log "$dir"/log/slurmd*.log >&2 || true
	exit 1
}

cmd_up() {
	local nodes=1 running k
	while (($#)); do
		case $1 in
		--nodes | -N)
			(($# >= 2)) || die "up: $1 needs a count"
			nodes=$2
			shift 2
			;;
		--nodes=*)
			nodes=${1#--nodes=}
			shift
			;;
		*) die "up: unknown argument $1 (usage: up [--nodes N])" ;;
		esac
	done
	[[ $nodes =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= max_nodes)) ||
		die "up: --nodes $nodes: want a count from 1 to $max_nodes"
	need munged mungekey slurmctld slurmd sinfo scontrol
	if ((nodes > 1)); then
		need ip nsenter
		(($(id -u) == 0)) || die "up --nodes $nodes: needs root (ip netns add); a one-node cluster does not"
	fi
	running=$(running_nodes)
	if ((running > 0 && running != nodes)); then
		die "a cluster of $running node(s) is up; run scripts/slurm-local.sh down first"
	fi

	mkdir -p "$dir"/{etc,munge,run,log,state/ctld}
	chmod 0755 "$dir" "$dir"/{etc,run,log,state}
	chmod 0700 "$dir/munge" "$dir/state/ctld"
	if ((nodes == 1)); then
		mkdir -p "$dir/state/slurmd"
		chmod 0700 "$dir/state/slurmd"
	else
		for ((k = 1; k <= nodes; k++)); do
			mkdir -p "$dir/state/slurmd-n$k"
			chmod 0700 "$dir/state/slurmd-n$k"
		done
	fi
	write_conf "$nodes"
	# Recorded before anything starts, so that down finds it all.
	echo "$nodes" >"$nodes_file"
	export SLURM_CONF=$conf
	if ((nodes > 1)); then
		net_up "$nodes"
	fi

	if ! alive "$munge_pid"; then
		if [[ ! -s $dir/munge/munge.key ]]; then
			mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
			chmod 0600 "$dir/munge/munge.key"
		fi
		log "starting munged"
		# Its socket is a path, which every network namespace reaches.
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
	if ((nodes == 1)); then
		if ! alive "$slurmd_pid"; then
			log "starting slurmd"
			slurmd -f "$conf" -N "$(node_name)"
		fi
	else
		for ((k = 1; k <= nodes; k++)); do
			alive "$(slurmd_pidfile "$nodes" "$k")" && continue
			log "starting slurmd n$k in $ns_prefix$k"
			# nsenter, not ip netns exec: that one also remounts /sys in a
			# mount namespace of its own, where slurmd finds no cgroup file system.
			nsenter --net="/run/netns/$ns_prefix$k" slurmd -f "$conf" -N "n$k"
		done
	fi
	wait_idle "$nodes"
	print_env
}

cmd_down() {
	local f
	for f in "$slurmd_pid" "$dir"/run/slurmd-n*.pid; do
		[[ -e $f ]] || continue
		f=${f##*/}
		f=${f%.pid}
		stop "$f" "$dir/run/$f.pid"
	done
	stop slurmctld "$ctld_pid"
	stop munged "$munge_pid"
	net_down
	rm -f "$nodes_file"
	log "down"
}

cmd_status() {
	local rc=0 nodes k p
	nodes=$(running_nodes)
	((nodes > 0)) || nodes=1
	local procs=("munged:$munge_pid" "slurmctld:$ctld_pid")
	if ((nodes == 1)); then
		procs+=("slurmd:$slurmd_pid")
	else
		for ((k = 1; k <= nodes; k++)); do
			procs+=("slurmd-n$k:$(slurmd_pidfile "$nodes" "$k")")
		done
	fi
	for p in "${procs[@]}"; do
		if alive "${p#*:}"; then
			printf '%-10s running (pid %s)\n' "${p%%:*}" "$(<"${p#*:}")"
		else
			printf '%-10s stopped\n' "${p%%:*}"
			rc=1
		fi
	done
	if ((nodes > 1)); then
		for ((k = 1; k <= nodes; k++)); do
			if [[ -e /run/netns/$ns_prefix$k ]]; then
				printf '%-10s namespace %s, address %s\n' "n$k" "$ns_prefix$k" "$(node_addr "$k")"
			else
				printf '%-10s namespace %s missing\n' "n$k" "$ns_prefix$k"
				rc=1
			fi
		done
	fi
	if ((rc == 0)); then
		SLURM_CONF=$conf sinfo -N -o '%N %T %c %m %o' || rc=1
	fi
	return $rc
}

case ${1:-} in
up)
	shift
	cmd_up "$@"
	;;
down) cmd_down ;;
status) cmd_status ;;
env) print_env ;;
*)
	echo "usage: $0 up [--nodes N]|down|status|env" >&2
	exit 2
	;;
esac
