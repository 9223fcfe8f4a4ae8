package roles

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"
)

// A parameter checkpoint file: "GEARPCK1", the version (u64), the reserved
// version (u64), the float count (u64), the floats (little-endian float32),
// CRC-32C of everything before it (u32).
const (
	paramCkptMagic  = "GEARPCK1"
	paramCkptHeader = 32
	// paramReserve is how far above a checkpointed version the checkpoint
	// reserves versions: a publisher that resumes from it starts above the
	// reservation, so the versions it publishes stay above every version
	// published before, even those after the last checkpoint.
	paramReserve = 1 << 10
)

// ParamCheckpoint is a parameter service's state as a checkpoint keeps it.
type ParamCheckpoint struct {
	// Version is the version whose parameters Params holds.
	Version uint64
	// Reserved is the highest version the service may have published: a
	// publisher resuming from the checkpoint publishes above it.
	Reserved uint64
	Params   []float32
}

// ReadParamCheckpoint reads and checks the parameter checkpoint at path. A
// missing file is an error wrapping fs.ErrNotExist.
func ReadParamCheckpoint(path string) (ParamCheckpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ParamCheckpoint{}, fmt.Errorf("roles: parameter checkpoint: %w", err)
	}
	bad := func(format string, args ...any) (ParamCheckpoint, error) {
		return ParamCheckpoint{}, fmt.Errorf("roles: parameter checkpoint %s: "+format, append([]any{path}, args...)...)
	}
	if len(b) < paramCkptHeader+4 || string(b[:8]) != paramCkptMagic {
		return bad("not a parameter checkpoint (%d bytes)", len(b))
	}
	n := binary.LittleEndian.Uint64(b[24:])
	if n > uint64(len(b)) || uint64(len(b)) != paramCkptHeader+4*n+4 {
		return bad("%d floats in %d bytes", n, len(b))
	}
	body := b[:len(b)-4]
	if got, want := crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)), binary.LittleEndian.Uint32(b[len(b)-4:]); got != want {
		return bad("checksum %08x, want %08x", got, want)
	}
	c := ParamCheckpoint{Version: binary.LittleEndian.Uint64(b[8:]), Reserved: binary.LittleEndian.Uint64(b[16:]), Params: make([]float32, n)}
	if c.Reserved < c.Version || c.Reserved > maxVersion {
		return bad("reserved version %d below version %d or above 2^63-1", c.Reserved, c.Version)
	}
	for i := range c.Params {
		c.Params[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[paramCkptHeader+4*i:]))
	}
	return c, nil
}

// writeParamCheckpoint writes c to path atomically: a temporary file in its
// directory, synced and renamed over path.
func writeParamCheckpoint(path string, c ParamCheckpoint) error {
	b := make([]byte, paramCkptHeader, paramCkptHeader+4*len(c.Params)+4)
	copy(b, paramCkptMagic)
	binary.LittleEndian.PutUint64(b[8:], c.Version)
	binary.LittleEndian.PutUint64(b[16:], c.Reserved)
	binary.LittleEndian.PutUint64(b[24:], uint64(len(c.Params)))
	for _, f := range c.Params {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// CheckpointTo keeps the service's state in the checkpoint file path across
// restarts of the job. If path holds a checkpoint (of this many floats), it is
// returned with true and the publisher takes its reservation as the last
// version: the next Publish must be above Reserved, so versions never go back
// across a restart, and the caller may resume from Params (publishing them
// first, as Reserved+1). From then on Publish rewrites path before it makes a
// version visible whenever the version passes the reservation (which it then
// moves paramReserve versions ahead) or every has passed since the last write
// (every <= 0: every publish). Call it before the first Publish.
func (p *Publisher) CheckpointTo(path string, every time.Duration) (ParamCheckpoint, bool, error) {
	c, err := ReadParamCheckpoint(path)
	found := err == nil
	switch {
	case found && len(c.Params) != p.n:
		return c, false, fmt.Errorf("roles: parameter checkpoint %s holds %d floats, service %q has %d", path, len(c.Params), p.name, p.n)
	case !found && !errors.Is(err, fs.ErrNotExist):
		return c, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ckPath, p.ckEvery = path, every
	if found {
		p.last = max(p.last, c.Reserved)
		p.reserved = c.Reserved
	}
	return c, found, nil
}

// checkpointLocked writes the checkpoint for version (params) before it is
// published, if it is due; p.mu is held.
func (p *Publisher) checkpointLocked(version uint64, params []float32) error {
	if p.ckPath == "" || (version <= p.reserved && time.Since(p.ckAt) < p.ckEvery) {
		return nil
	}
	reserved := max(p.reserved, min(version+paramReserve, maxVersion))
	if err := writeParamCheckpoint(p.ckPath, ParamCheckpoint{Version: version, Reserved: reserved, Params: params}); err != nil {
		return fmt.Errorf("roles: publish version %d of %q: checkpoint: %w", version, p.name, err)
	}
	p.reserved, p.ckAt = reserved, time.Now()
	return nil
}
