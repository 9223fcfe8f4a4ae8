package gmi

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fakeBenchEnv makes the test binary act as a benchmark (see fakeBench).
const fakeBenchEnv = "GMI_TEST_FAKE_BENCH"

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeBenchEnv); mode != "" {
		os.Exit(fakeBench(mode))
	}
	goleak.VerifyTestMain(m)
}

// gpuEfficiency is the fake GPU's total throughput factor with K GMIs: it
// peaks at K = 4.
var gpuEfficiency = []float64{1.0, 1.6, 2.0, 2.3, 2.2, 2.1, 2.0, 1.9, 1.8, 1.7}

// satEnv is the fake GMI's saturation point: more environments than this
// add memory and no throughput.
const satEnv = 1024

// fakeBench is a benchmark that follows the protocol: it reads
// GEAR_GMI_PER_GPU and GEAR_NUM_ENV and prints throughput and memory. One
// GMI's throughput is 1000·eff(K)/K per environment up to satEnv; memory is
// 100 MB + 1 MB per environment; a configuration whose K GMIs need more than
// 40 GB fails. Algorithm 2 must answer K = 4, num_env = 1024.
func fakeBench(mode string) int {
	k, err1 := strconv.Atoi(os.Getenv(EnvGMIPerGPU))
	env, err2 := strconv.Atoi(os.Getenv(EnvNumEnv))
	if err1 != nil || err2 != nil || k < 1 || k > len(gpuEfficiency) {
		fmt.Fprintln(os.Stderr, "bad configuration")
		return 2
	}
	switch mode {
	case "hang":
		time.Sleep(time.Hour)
	case "fail":
		fmt.Println("starting")
		fmt.Fprintln(os.Stderr, "CUDA error: out of memory")
		return 1
	case "silent":
		fmt.Println("done")
		return 0
	case "env":
		for _, k := range []string{EnvCUDAVisibleDevices, EnvCUDADeviceOrder, EnvMPSThreadPercent, EnvMPSPinnedMemLimit, EnvGMILayout} {
			fmt.Printf("%s=%s\n", k, os.Getenv(k))
		}
		fmt.Println("throughput=1")
		return 0
	}
	mem := 100e6 + float64(env)*1e6
	if float64(k)*mem > 40e9 {
		fmt.Fprintln(os.Stderr, "CUDA error: out of memory")
		return 1
	}
	top := 1000 * gpuEfficiency[k-1] / float64(k) * float64(min(env, satEnv))
	fmt.Printf("warming up\nstep 1 throughput=%g\n", top/2)
	if mode == "no-memory" {
		fmt.Printf("throughput=%g\n", top)
	} else {
		fmt.Printf("throughput=%g memory=%g\n", top, mem)
	}
	return 0
}
