package store_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gear-rl/gear/store"
	"github.com/gear-rl/gear/store/storetest"
)

// The tests re-execute their own binary to get real writer, killed-writer and
// checkpointer processes: TestMain runs a child role when these are set.
const (
	envRole  = "STORETEST_ROLE"
	envShard = "STORETEST_SHARD"
	envArg   = "STORETEST_ARG"
	envChunk = "STORETEST_CHUNK" // the child's WithChunk (default: the shard's)
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(runChild(role, os.Getenv(envShard), os.Getenv(envArg)))
	}
	code := m.Run()
	if left, err := storetest.Leftovers(); err != nil || len(left) > 0 {
		fmt.Fprintf(os.Stderr, "segments left in /dev/shm: %v %v\n", left, err)
		for _, name := range left {
			_ = store.Remove(name)
		}
		code = 1
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goroutines left: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

func runChild(role, name, arg string) int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", role, err)
		return 1
	}
	if role == "owner" {
		return runOwner(name, arg)
	}
	var opts []store.Option
	if n, err := strconv.Atoi(os.Getenv(envChunk)); err == nil {
		opts = append(opts, store.WithChunk(n))
	}
	s, err := store.Attach(ctx, name, opts...)
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	switch role {
	case "writer":
		// arg: "<writer id> <duration>". Inserts payloads id<<40|n until the time is up
		// and prints how many it committed.
		f := strings.Fields(arg)
		id, _ := strconv.Atoi(f[0])
		d, _ := time.ParseDuration(f[1])
		deadline := time.Now().Add(d)
		n := 0
		for time.Now().Before(deadline) {
			p, err := s.Allocate(ctx)
			if err != nil {
				return fail(err)
			}
			key := uint64(id)<<40 | uint64(n)
			storetest.Fill(p, key)
			if _, err := p.CommitKey(key, float64(n%97+1)); err != nil {
				return fail(err)
			}
			n++
		}
		fmt.Println(n)
		return 0
	case "hang-writing":
		// Allocate, write half a row, say which row, and wait to be killed.
		p, err := s.Allocate(ctx)
		if err != nil {
			return fail(err)
		}
		obs := p.Block(0)
		for i := range obs[:len(obs)/2] {
			obs[i] = 0xAB
		}
		fmt.Println(p.Index())
		_, _ = io.Copy(io.Discard, os.Stdin)
		time.Sleep(time.Hour)
		return 0
	case "hang-reading":
		// Hold a View of every committed row (twice for the first: two Views of one
		// row), say "pinned N", and wait to be killed.
		n := 0
		first := true
		for st := range s.Rows() {
			if _, err := s.Read(st.Ref()); err != nil {
				return fail(err)
			}
			n++
			if first {
				if _, err := s.Read(st.Ref()); err != nil {
					return fail(err)
				}
				n++
				first = false
			}
		}
		fmt.Println("pinned", n)
		_, _ = io.Copy(io.Discard, os.Stdin)
		time.Sleep(time.Hour)
		return 0
	case "hang-committing":
		// Write a whole row and die inside Commit, after the insertion sequence is taken.
		store.SetCommittingHook(s, func() {
			fmt.Println("committing")
			time.Sleep(time.Hour)
		})
		p, err := s.Allocate(ctx)
		if err != nil {
			return fail(err)
		}
		storetest.Fill(p, 1<<50)
		fmt.Println(p.Index())
		_, _ = p.Commit(1)
		return 0
	case "checkpoint":
		// arg: "<path> <frame size> <pause per frame>". Checkpoints slowly, saying
		// "frame" after writing each frame.
		f := strings.Fields(arg)
		fs, _ := strconv.Atoi(f[1])
		pause, _ := time.ParseDuration(f[2])
		fmt.Println("start")
		err := s.Checkpoint(ctx, f[0], store.WithFrameSize(fs), store.WithProgress(func(done, total int64) {
			fmt.Println("frame")
			time.Sleep(pause)
		}))
		if err != nil {
			return fail(err)
		}
		fmt.Println("done")
		return 0
	}
	return fail(fmt.Errorf("unknown role"))
}

// child is a running child process.
type child struct {
	cmd   *exec.Cmd
	out   *bufio.Reader
	stdin io.WriteCloser
}

// startChild runs this test binary as a child in role, attached to shard name. The
// child is killed (if still running) and reaped when the test ends.
func startChild(t *testing.T, role, name, arg string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+role, envShard+"="+name, envArg+"="+arg)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, out: bufio.NewReader(out), stdin: stdin}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

// line reads the child's next output line.
func (c *child) line(t *testing.T) string {
	t.Helper()
	s, err := c.out.ReadString('\n')
	if err != nil {
		t.Fatalf("child %d: reading its output: %v", c.cmd.Process.Pid, err)
	}
	return strings.TrimSpace(s)
}

// kill sends SIGKILL and reaps the child.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}

// wait waits for the child to exit and fails the test unless it exits 0.
func (c *child) wait(t *testing.T) {
	t.Helper()
	_ = c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child %d: %v", c.cmd.Process.Pid, err)
	}
}
