// Command multinode is the rank program of the multi-node SLURM tests in
// package jobs (jobs/multinode_test.go). It runs under `gearrun submit` on a
// cluster of several nodes (scripts/slurm-local.sh up --nodes 3) and prints
// lines starting with "MN " that the tests read:
//
//	multinode allreduce   hierarchical AllReduce over the world, and which
//	                      transport reached which peer (shared-memory
//	                      mappings, TCP connections by remote address)
//	multinode replay      a distributed replay table: actors insert into
//	                      their shards, the trainer samples with the split
//	                      draw and collects the rows from the actors' nodes
//	multinode mpmd        every role on its nodes: the world and per-role
//	                      communicators
//	multinode hold DIR    AllReduce in a loop until killed; DIR receives a file
//	                      per rank naming its node and pid; in a restarted
//	                      generation (GEAR_RESTART_COUNT > 0), 20 AllReduces
//	                      and the end
//	multinode elastic DIR an elastic replay: in the first generation every
//	                      rank fills a store shard of its own with keyed
//	                      rows, checkpoints it to GEAR_CHECKPOINT_DIR
//	                      (shard.<rank>.ckpt, labelled with the world's
//	                      size), writes DIR/<rank> as hold does and holds;
//	                      in a smaller restarted world rank i takes over old
//	                      rank i's shard (the segment on its node, else the
//	                      checkpoint) and the checkpoints of old ranks j >=
//	                      the new size with j mod size == i, and the world
//	                      checks that every row of every old rank is in
//	                      exactly one shard
//
// It exits non-zero, with the reason on stderr, when a check fails. It sits
// under cmd, beside gear's commands, and not in the jobs tree: jobs imports
// neither sample nor store, and no library imports a test program.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
	"github.com/gear-rl/gear/sample"
	"github.com/gear-rl/gear/sample/sampletest"
	"github.com/gear-rl/gear/store"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: multinode allreduce|replay|mpmd|hold DIR|elastic DIR")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "allreduce":
		err = run(ctx, allReduce)
	case "replay":
		err = run(ctx, replay)
	case "mpmd":
		err = run(ctx, mpmd)
	case "hold":
		err = run(ctx, hold)
	case "elastic":
		err = run(ctx, elastic)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "multinode %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// run joins the world, builds the world communicator (shared memory within a
// host, TCP across) and runs fn.
func run(ctx context.Context, fn func(context.Context, *rank.World, *collective.Comm) error) error {
	w, err := rank.Init(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	c, err := collective.New(ctx, w)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("MN rank %d/%d node %s (%d/%d) local %d/%d role %q %d/%d host %s\n",
		w.Rank(), w.Size(), rank.NodeName(), w.NodeRank(), w.NumNodes(), w.LocalRank(), w.LocalSize(),
		w.Role(), w.RoleRank(), w.RoleSize(), w.Host())
	if err := fn(ctx, w, c); err != nil {
		return err
	}
	return c.Barrier(ctx)
}

// allReduce checks the hierarchical AllReduce and reports the transports.
func allReduce(ctx context.Context, w *rank.World, c *collective.Comm) error {
	hosts := c.Hosts()
	if len(hosts) != w.NumNodes() {
		return fmt.Errorf("communicator hosts %v: want one per node (%d)", hosts, w.NumNodes())
	}
	n := w.Size()
	small := []int64{int64(w.Rank())}
	if err := collective.AllReduce(ctx, c, small, collective.Sum); err != nil {
		return err
	}
	if want := int64(n * (n - 1) / 2); small[0] != want {
		return fmt.Errorf("allreduce of ranks: %d, want %d", small[0], want)
	}
	// Large enough for the bandwidth path (reduce within hosts, among leaders, back).
	big := make([]float64, 1<<20)
	for i := range big {
		big[i] = float64(w.Rank()+1) * float64(i%7)
	}
	if err := collective.AllReduce(ctx, c, big, collective.Sum); err != nil {
		return err
	}
	tri := float64(n * (n + 1) / 2)
	for i, v := range big {
		if v != tri*float64(i%7) {
			return fmt.Errorf("allreduce element %d: %v, want %v", i, v, tri*float64(i%7))
		}
	}

	// Which peers are on this host, and what the process holds: its mapped
	// shared-memory segments, and its TCP connections by remote address.
	mine := -1
	for h, ranks := range hosts {
		if slices.Contains(ranks, c.Rank()) {
			mine = h
		}
	}
	var shm, tcp []int
	for h, ranks := range hosts {
		for _, r := range ranks {
			if r == c.Rank() {
				continue
			}
			if h == mine {
				shm = append(shm, r)
			} else {
				tcp = append(tcp, r)
			}
		}
	}
	segs, err := mappedSegments(w.JobID())
	if err != nil {
		return err
	}
	remotes, err := tcpRemotes(os.Getenv(rank.EnvRdzvAddr))
	if err != nil {
		return err
	}
	fmt.Printf("MN allreduce rank %d node %s sum %d big ok listen %s shm-peers %s tcp-peers %s shm-segments %d tcp-remotes %s\n",
		w.Rank(), rank.NodeName(), small[0], w.ListenHost(), ints(shm), ints(tcp), len(segs), strings.Join(remotes, ","))
	return nil
}

// mappedSegments lists the job's shared-memory segments this process maps.
func mappedSegments(job string) ([]string, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	prefix := "/dev/shm/" + rank.SegmentName(job, "")
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && strings.HasPrefix(fields[5], prefix) && !slices.Contains(out, fields[5]) {
			out = append(out, fields[5])
		}
	}
	return out, sc.Err()
}

// tcpRemotes lists the remote addresses (one per address, with a count) of
// this process's established TCP connections, leaving out those to rdzv.
func tcpRemotes(rdzv string) ([]string, error) {
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	count := map[string]int{}
	for _, file := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			if len(f) < 10 || f[3] != "01" || !inodes[f[9]] {
				continue
			}
			addr, err := procAddr(f[2])
			if err != nil {
				return nil, err
			}
			if addr == rdzv {
				continue
			}
			host, _, _ := net.SplitHostPort(addr)
			count[host]++
		}
	}
	var out []string
	for h, n := range count {
		out = append(out, fmt.Sprintf("%s*%d", h, n))
	}
	slices.Sort(out)
	return out, nil
}

// procAddr decodes an address of /proc/net/tcp{,6} ("0100007F:1F90").
func procAddr(s string) (string, error) {
	h, p, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(h)
	port, perr := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil || perr != nil || (len(b) != 4 && len(b) != 16) {
		return "", fmt.Errorf("bad address %q in /proc/net/tcp", s)
	}
	// Each 32-bit word is in host (little-endian) order.
	ip := make(net.IP, len(b))
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(ip[i:], binary.LittleEndian.Uint32(b[i:]))
	}
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(int(port))), nil
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return "[" + strings.Join(s, ",") + "]"
}

// The replay table: every actor inserts replayItems items into its shard, the
// trainer none; keys are actor*1000+k, priorities replayPriority(key).
const (
	replayItems    = 24
	replayExponent = 0.8
	replayBatches  = 40
	replayBatch    = 512
	replayFloats   = 64
)

func replayPriority(key uint64) float64 {
	if key%11 == 5 {
		return 0 // never sampled
	}
	return 0.1 + float64((key*7919)%97)/24
}

// replayRow is the payload of key's row: float32 values derived from the key.
func replayRow(key uint64, i int) float32 { return float32(key)*1000 + float32(i) }

// replay: actors on two nodes write, the trainer on a third samples with the
// split draw and collects the sampled rows from them.
func replay(ctx context.Context, w *rank.World, c *collective.Comm) error {
	spec := store.Spec{
		Capacity: 64,
		Remover:  store.RemoverNone,
		Columns: []store.Column{
			{Name: "key", DType: store.Int64, Length: 1},
			{Name: "payload", DType: store.Float32, Shape: []int{replayFloats}, Length: 1},
		},
	}
	shard, err := store.Create(rank.SegmentName(w.JobID(), fmt.Sprintf("store.replay.%d", w.Rank())), spec)
	if err != nil {
		return err
	}
	defer shard.Close()
	pr, err := sample.NewPrioritized(replayExponent)
	if err != nil {
		return err
	}
	st, err := sample.NewShardTable(shard, sample.Config{Name: "replay", Sampler: pr, Remover: sample.NewFIFO(), Seed: uint64(w.Rank())})
	if err != nil {
		return err
	}
	defer st.Close()
	if w.Role() == "actor" {
		for k := range uint64(replayItems) {
			key := uint64(w.RoleRank())*1000 + k
			_, err := st.Insert(ctx, key, replayPriority(key), func(p store.Pending) error {
				binary.LittleEndian.PutUint64(p.Block(0), key)
				row := p.Block(1)
				for i := range replayFloats {
					binary.LittleEndian.PutUint32(row[4*i:], math.Float32bits(replayRow(key, i)))
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	d, err := sample.NewDistTable(ctx, c, st, sample.WithMode(sample.ModeSplit), sample.WithSeed(11))
	if err != nil {
		return err
	}
	defer d.Close()

	trainer := w.Role() == "trainer"
	actors := w.Size() - 1
	keys := make([]uint64, 0, actors*replayItems)
	want := make([]float64, 0, actors*replayItems)
	var total float64
	for a := range uint64(actors) {
		for k := range uint64(replayItems) {
			key := a*1000 + k
			keys = append(keys, key)
			want = append(want, math.Pow(replayPriority(key), replayExponent))
			total += want[len(want)-1]
		}
	}
	counts := make([]int, len(keys))
	remote, collected := 0, 0
	for range replayBatches {
		b, err := d.Sample(ctx, replayBatch)
		if err != nil {
			return err
		}
		var idx []int
		if trainer {
			if len(b.Items) != replayBatch {
				return fmt.Errorf("batch of %d items, want %d", len(b.Items), replayBatch)
			}
			for _, x := range b.Items {
				i := slices.Index(keys, x.Key)
				if i < 0 {
					return fmt.Errorf("sampled unknown key %d", x.Key)
				}
				counts[i]++
				if p := want[i] / total; math.Abs(x.Probability-p) > 1e-9 {
					return fmt.Errorf("key %d: probability %v, want %v", x.Key, x.Probability, p)
				}
				idx = append(idx, x.Index)
				if x.Index/d.Capacity() != c.Rank() {
					remote++
				}
			}
		}
		bufs, err := d.Collect(ctx, idx, []string{"key", "payload"}, sample.Window{})
		if err != nil {
			return err
		}
		for j, x := range b.Items[:len(idx)] {
			got := binary.LittleEndian.Uint64(bufs[0][8*j:])
			row := bufs[1][4*replayFloats*j:]
			if got != x.Key {
				return fmt.Errorf("collected row %d (index %d) holds key %d, want %d", j, x.Index, got, x.Key)
			}
			for i := range replayFloats {
				if v := math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:])); v != replayRow(x.Key, i) {
					return fmt.Errorf("collected row of key %d: payload[%d] = %v, want %v", x.Key, i, v, replayRow(x.Key, i))
				}
			}
			collected++
		}
		b.Release()
	}
	if trainer {
		stat, dof, p, err := sampletest.ChiSquare(counts, want)
		if err != nil {
			return err
		}
		fmt.Printf("MN replay trainer node %s samples %d remote %d collected %d chi2 %.2f dof %d p %.4g\n",
			rank.NodeName(), replayBatches*replayBatch, remote, collected, stat, dof, p)
	} else {
		fmt.Printf("MN replay actor %d node %s items %d\n", w.RoleRank(), rank.NodeName(), replayItems)
	}
	return nil
}

// mpmd: the world communicator and one per role.
func mpmd(ctx context.Context, w *rank.World, c *collective.Comm) error {
	roles := w.Roles()
	color := slices.IndexFunc(roles, func(r rank.Role) bool { return r.Name == w.Role() })
	if color < 0 {
		return fmt.Errorf("role %q is not among the world's roles %v", w.Role(), roles)
	}
	rc, err := c.Split(ctx, color, w.RoleRank())
	if err != nil {
		return err
	}
	defer rc.Close()
	if rc.Size() != w.RoleSize() || rc.Rank() != w.RoleRank() {
		return fmt.Errorf("role communicator: rank %d of %d, want %d of %d", rc.Rank(), rc.Size(), w.RoleRank(), w.RoleSize())
	}
	sum := []int64{int64(w.RoleRank())}
	if err := collective.AllReduce(ctx, rc, sum, collective.Sum); err != nil {
		return err
	}
	world := []int64{1}
	if err := collective.AllReduce(ctx, c, world, collective.Sum); err != nil {
		return err
	}
	fmt.Printf("MN mpmd rank %d role %s %d/%d node %s role-sum %d role-hosts %d world-sum %d\n",
		w.Rank(), w.Role(), w.RoleRank(), w.RoleSize(), rank.NodeName(), sum[0], len(rc.Hosts()), world[0])
	return nil
}

// hold runs AllReduce until killed (or the world fails), after writing
// DIR/<rank> with "<node> <pid>".
func hold(ctx context.Context, w *rank.World, c *collective.Comm) error {
	return holdWith(ctx, w, c, 1<<16, time.Millisecond)
}

// holdWith is hold with AllReduces of n floats, pause apart.
func holdWith(ctx context.Context, w *rank.World, c *collective.Comm, n int, pause time.Duration) error {
	if len(os.Args) < 3 {
		return errors.New("hold: want a directory")
	}
	buf := make([]float32, n)
	for i := 0; ; i++ {
		if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
			fmt.Printf("MN hold rank %d node %s: allreduce %d: %v\n", w.Rank(), rank.NodeName(), i, err)
			return err
		}
		if w.RestartCount() > 0 {
			if i == 19 {
				fmt.Printf("MN hold rank %d/%d generation %d node %s: %d allreduces\n", w.Rank(), w.Size(), w.RestartCount(), rank.NodeName(), i+1)
				return nil
			}
			continue
		}
		if i == 0 {
			path := filepath.Join(os.Args[2], strconv.Itoa(w.Rank()))
			line := fmt.Sprintf("%s %d\n", rank.NodeName(), os.Getpid())
			if err := os.WriteFile(path+".tmp", []byte(line), 0o644); err != nil {
				return err
			}
			if err := os.Rename(path+".tmp", path); err != nil {
				return err
			}
		}
		time.Sleep(pause)
	}
}

// Elastic replay: rows per rank, and the key of row k of rank r.
const elasticRows = 300

func elasticKey(r, k int) uint64 { return uint64(r)<<32 | uint64(k) }

func elasticSpec(capacity int) store.Spec {
	return store.Spec{
		Capacity: capacity,
		Remover:  store.RemoverNone,
		Columns:  []store.Column{{Name: "payload", DType: store.Float32, Shape: []int{16}, Length: 1}},
	}
}

// elasticSegment names old rank r's shard on node.
func elasticSegment(w *rank.World, node string, r int) string {
	return rank.SegmentName(w.JobID(), fmt.Sprintf("mn.elastic.%s.%d", node, r))
}

// elasticCheckpoint is the path of rank r's shard checkpoint.
func elasticCheckpoint(dir string, r int) string {
	return filepath.Join(dir, fmt.Sprintf("shard.%d.ckpt", r))
}

// elastic: a shard per rank, checkpointed, then held until the world dies;
// in the next, smaller, world the survivors take over every old shard.
func elastic(ctx context.Context, w *rank.World, c *collective.Comm) error {
	if len(os.Args) < 3 {
		return errors.New("elastic: want a directory")
	}
	dir, ckpt := os.Args[2], w.CheckpointDir()
	if ckpt == "" {
		return errors.New("elastic: no checkpoint directory (GEAR_CHECKPOINT_DIR)")
	}
	if w.RestartCount() > 0 {
		return elasticRestore(ctx, w, c, dir, ckpt)
	}
	shard, err := store.CreateOrOpen(elasticSegment(w, rank.NodeName(), w.Rank()), elasticSpec(elasticRows))
	if err != nil {
		return err
	}
	for k := range elasticRows {
		p, err := shard.Allocate(ctx)
		if err != nil {
			return err
		}
		row := p.Block(0)
		for i := range 16 {
			binary.LittleEndian.PutUint32(row[4*i:], math.Float32bits(float32(w.Rank()*elasticRows+k)+float32(i)/16))
		}
		if _, err := p.CommitKey(elasticKey(w.Rank(), k), 1); err != nil {
			return err
		}
	}
	path := elasticCheckpoint(ckpt, w.Rank())
	if err := shard.Checkpoint(ctx, path, store.WithLabel(uint64(w.Size()))); err != nil {
		return err
	}
	fmt.Printf("MN elastic rank %d/%d node %s: %d rows, checkpoint %s\n", w.Rank(), w.Size(), rank.NodeName(), elasticRows, filepath.Base(path))
	// The shard stays in shared memory, owned by this rank, until it dies:
	// the next generation re-attaches it where it can.
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	// Held with small AllReduces at a slow pace: what matters here is the
	// shards, and the machine's other work (and heartbeats) keep their CPU.
	return holdWith(ctx, w, c, 64, 10*time.Millisecond)
}

// elasticRestore is a restarted generation of elastic.
func elasticRestore(ctx context.Context, w *rank.World, c *collective.Comm, dir, ckpt string) error {
	me, n := w.Rank(), w.Size()
	info, err := store.ReadCheckpointInfo(elasticCheckpoint(ckpt, me))
	if err != nil {
		return err
	}
	old := int(info.Label) // the size of the world that wrote the checkpoints
	if old <= n {
		return fmt.Errorf("elastic: checkpoints of a world of %d, this one has %d: want a smaller one", old, n)
	}
	oldNode := make([]string, old)
	for j := range old {
		b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(j)))
		f := strings.Fields(string(b))
		if err != nil || len(f) != 2 {
			return fmt.Errorf("elastic: where old rank %d ran: %q, %v", j, b, err)
		}
		oldNode[j] = f[0]
	}
	mine := []int{me}
	for j := n; j < old; j++ {
		if j%n == me {
			mine = append(mine, j)
		}
	}
	shard, err := store.Create(rank.SegmentName(w.JobID(), fmt.Sprintf("mn.elastic.g%d.%d", w.RestartCount(), me)), elasticSpec(len(mine)*elasticRows))
	if err != nil {
		return err
	}
	defer shard.Close()
	node := rank.NodeName()
	for _, j := range mine {
		how := "re-attached"
		var got int
		var prev *store.Shard
		err := fs.ErrNotExist
		if oldNode[j] == node {
			// Only this node's shared memory: another node's is out of
			// reach on a cluster (these nodes share /dev/shm).
			prev, err = store.Open(elasticSegment(w, oldNode[j], j), elasticSpec(elasticRows))
		}
		if err == nil {
			got, err = shard.MergeFrom(ctx, prev)
			prev.Close() // its owner now: the segment goes
		} else {
			how = "restored"
			got, err = shard.MergeCheckpoint(ctx, elasticCheckpoint(ckpt, j))
		}
		if err != nil {
			return fmt.Errorf("elastic: old rank %d: %w", j, err)
		}
		src := "its segment"
		if how == "restored" {
			src = "checkpoint " + filepath.Base(elasticCheckpoint(ckpt, j))
		}
		fmt.Printf("MN elastic rank %d/%d generation %d node %s: %s %d rows of old rank %d (node %s) from %s\n",
			me, n, w.RestartCount(), node, how, got, j, oldNode[j], src)
	}
	// Every row of every old rank, in exactly one shard of the new world.
	counts := make([]int64, old+1) // per old rank, and the rows of no rank
	for st := range shard.Rows() {
		r, k := int(st.Key>>32), int(uint32(st.Key))
		if r >= old || k >= elasticRows {
			counts[old]++
			continue
		}
		v, err := shard.Read(st.Ref())
		if err != nil {
			return err
		}
		if x := math.Float32frombits(binary.LittleEndian.Uint32(v.Block(0)[4:])); x != float32(r*elasticRows+k)+1.0/16 {
			v.Done()
			return fmt.Errorf("elastic: row of key %#x: payload %v", st.Key, x)
		}
		v.Done()
		counts[r]++
	}
	if err := collective.AllReduce(ctx, c, counts, collective.Sum); err != nil {
		return err
	}
	total := int64(0)
	for j, v := range counts[:old] {
		if v != elasticRows {
			return fmt.Errorf("elastic: old rank %d: %d rows in the world, want %d", j, v, elasticRows)
		}
		total += v
	}
	if counts[old] != 0 {
		return fmt.Errorf("elastic: %d rows of no old rank", counts[old])
	}
	fmt.Printf("MN elastic rank %d/%d generation %d node %s: every row accounted for: %d old ranks x %d = %d rows\n",
		me, n, w.RestartCount(), node, old, elasticRows, total)
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	if me == 0 {
		// The old shards nobody took over from shared memory: those of the
		// nodes this world left out, and of ranks restored elsewhere. The
		// nodes share /dev/shm here, so rank 0 removes them all.
		for j := range old {
			if err := store.Remove(elasticSegment(w, oldNode[j], j)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}
