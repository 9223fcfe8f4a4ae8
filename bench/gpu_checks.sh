#!/usr/bin/env bash
# Every GPU check of docs/gpu.md ("On a GPU machine: every GPU check") in one
# go, on a machine with an NVIDIA GPU, from the repository's root. Build the
# binaries first, on any machine with Go (the GPU machine needs none):
#
#     bench/gpu_checks.sh build
#
# then, on the GPU machine:
#
#     bench/gpu_checks.sh run [outdir]
#
# Each check runs under its own time limit, all of them within
# GEAR_GPU_CHECKS_BUDGET seconds (default 360); a check that would start with
# less than 5 s left is reported as not run. The device tests run side by side
# (they share the GPU, not their numbers); the benchmarks run one at a time.
# Each check's output lands in outdir (default gpu-checks/) as <check>.log, and
# the summary (driver, CUDA and NCCL versions, each test binary's verdict, the
# figures the acceptance names) is printed last and kept in summary.txt. Where
# bin/gearbench-old is an earlier build, `gearbench gpu` runs with it too,
# between two runs of the current one, for a change's before and after.
set -u

build() {
	set -e
	mkdir -p bin
	local flags=(-ldflags=-s\ -w)
	go test -c "${flags[@]}" -o bin/cuda.test ./cuda
	go test -c "${flags[@]}" -o bin/nccl.test ./collective/nccl
	go test -c "${flags[@]}" -o bin/sample.test ./sample
	go test -c "${flags[@]}" -o bin/gpulearn.test ./examples/dqn/gpulearn
	go build "${flags[@]}" -o bin/dqn ./examples/dqn
	go build "${flags[@]}" -o bin/gearbench ./cmd/gearbench
}

out=gpu-checks
budget=${GEAR_GPU_CHECKS_BUDGET:-360}
start=$SECONDS

# limit prints the seconds a check of at most $1 seconds may run now.
limit() {
	local left=$((budget - (SECONDS - start)))
	((left < $1)) && echo "$left" || echo "$1"
}

# check NAME SECONDS CMD...: runs CMD with its output in $out/NAME.log.
check() {
	local name=$1 lim
	lim=$(limit "$2")
	shift 2
	if ((lim < 5)); then
		echo "not run: out of time" >"$out/$name.log"
		echo "$name: not run (out of time)"
		return
	fi
	local t0=$SECONDS rc
	timeout -k 5 "$lim" "$@" >"$out/$name.log" 2>&1
	rc=$?
	echo "$name: exit $rc after $((SECONDS - t0)) s (limit $lim s)" | tee -a "$out/times.txt"
}

# verdict NAME: a test binary's result from its log.
verdict() {
	local log=$out/$1.log
	local pass fail skip
	pass=$(grep -c -- '--- PASS' "$log")
	fail=$(grep -c -- '--- FAIL' "$log")
	skip=$(grep -c -- '--- SKIP' "$log")
	echo "$1: $pass passed, $fail failed, $skip skipped"
	grep -- '--- FAIL\|--- SKIP' "$log" | sed 's/^ */    /'
	grep -m 1 'skipping:' "$log" | sed 's/^ */    first reason: /' | cut -c 1-200
}

run() {
	out=${1:-gpu-checks}
	mkdir -p "$out"
	: >"$out/times.txt"
	for b in cuda.test nccl.test sample.test gpulearn.test dqn gearbench; do
		if [[ ! -x bin/$b ]]; then
			echo "bin/$b is missing: run bench/gpu_checks.sh build first" >&2
			exit 2
		fi
	done
	# NCCL from Python's nvidia-nccl package when the loader has none.
	if [[ -z ${GEAR_NCCL_LIB:-} ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
		local p
		p=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
		[[ -n $p && -e $p ]] && export GEAR_NCCL_LIB=$p
	fi
	{
		date -u
		nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.max.sm --format=csv
		nvidia-smi | sed -n '1,12p'
		nproc
		echo "GEAR_NCCL_LIB=${GEAR_NCCL_LIB:-}"
	} >"$out/device.log" 2>&1

	# The device tests, side by side; the fakes' forms are CI's.
	check cuda 150 bin/cuda.test -test.v -test.skip '/fake' \
		-test.run 'Twin|RingAcrossProcesses|MatchesCPU$|Errors$|OnGPU|NCCLOnGPU' &
	check nccl 150 bin/nccl.test -test.v -test.run 'OnGPU' &
	check sample 150 bin/sample.test -test.v -test.skip '/fake' -test.run \
		'^Test(CollectDeviceMatchesCollect|CollectDeviceByCopies|CollectDeviceLargeRows|DeviceSelectionMatchesTwin|DeviceSelectionEqualsSumTree|DeviceTopMatchesHeap|DistributedCollectDeviceOnGPUs)$' &
	check gpulearn 150 bin/gpulearn.test -test.v -test.skip '/fake' &
	wait

	# The figures, one at a time.
	check gearbench-gpu 60 bin/gearbench gpu
	check learner-gpu 60 bin/gearbench learner --hidden 1024 --batch 1024 --device gpu --steps 200
	check learner-cpu 60 bin/gearbench learner --hidden 1024 --batch 1024 --device cpu --steps 5 --actors 0
	check gmi 60 bin/cuda.test -test.run '^$' -test.bench GMIChannel -test.benchtime 20000x
	check dqn-gpu 180 bin/dqn --device gpu --seed 1
	if [[ -x bin/gearbench-old ]]; then # an earlier build, for a change's before and after
		check gearbench-gpu-old 60 bin/gearbench-old gpu --sizes 1000000
		check gearbench-gpu-again 60 bin/gearbench gpu --sizes 1000000
	fi
	check gearbench-gpu-1024 60 bin/gearbench gpu --blocks 1024 --capacity 2048 --sizes 1000000
	# Where a gather's time goes: its ways, and CollectDevice's runs.
	check gather-ways 90 bin/cuda.test -test.run '^$' -test.bench GatherWays -test.benchtime 200x
	check collect-runs 60 bin/sample.test -test.run '^$' -test.bench CollectDeviceRuns -test.benchtime 300x

	{
		echo "== device"
		cat "$out/device.log"
		echo "== tests"
		for t in cuda nccl sample gpulearn; do verdict "$t"; done
		grep -h 'NCCL version' "$out/cuda.log" | head -n 1
		echo "== figures"
		grep -h 'op=' "$out"/gearbench-gpu*.log "$out"/learner-*.log 2>/dev/null
		grep -h '^Benchmark' "$out/gmi.log" "$out/gather-ways.log" "$out/collect-runs.log"
		grep -h 'solved\|dqn:' "$out/dqn-gpu.log" | tail -n 3
		echo "== times"
		cat "$out/times.txt"
	} >"$out/summary.txt" 2>&1
	cat "$out/summary.txt"
}

case ${1:-} in
build) build ;;
run) run "${2:-gpu-checks}" ;;
*)
	echo "usage: bench/gpu_checks.sh build | run [outdir]" >&2
	exit 2
	;;
esac
