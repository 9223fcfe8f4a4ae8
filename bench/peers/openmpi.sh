# openmpi.sh: sourced by the scripts that run Open MPI beside gear. need_openmpi
# installs Open MPI (openmpi-bin, libopenmpi-dev) with apt-get, through sudo
# when not root, unless mpicc and mpirun are already on PATH.
need_openmpi() {
	if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
		return 0
	fi
	echo "$(basename "$0"): installing Open MPI (openmpi-bin libopenmpi-dev)" >&2
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openmpi-bin libopenmpi-dev >&2
}
