package gmi

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/gear-rl/gear/internal/tomlerr"
)

// The topology file: a TOML description of one machine's GPUs that stands in
// for NVML, so that plans can be made and tested anywhere. Unknown keys are
// errors. See examples/topologies for samples and docs/gmi.md for the fields.
type topoFile struct {
	Driver string    `toml:"driver"`
	MPS    mpsFile   `toml:"mps"`
	GPU    []gpuFile `toml:"gpu"`
}

type mpsFile struct {
	Running bool   `toml:"running"`
	PipeDir string `toml:"pipe_dir"`
}

type gpuFile struct {
	Index             *int      `toml:"index"`
	UUID              string    `toml:"uuid"`
	Name              string    `toml:"name"`
	ComputeCapability string    `toml:"compute_capability"`
	MemoryMiB         uint64    `toml:"memory_mib"`
	MIG               bool      `toml:"mig"`
	Instances         []migFile `toml:"instances"`
}

type migFile struct {
	UUID            string `toml:"uuid"`
	Profile         string `toml:"profile"`
	GPUInstance     *int   `toml:"gi"`
	ComputeInstance *int   `toml:"ci"`
	SMs             int    `toml:"sms"`
	MemoryMiB       uint64 `toml:"memory_mib"`
}

// LoadTopology reads a topology file.
func LoadTopology(path string) (*Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gmi: topology file: %w", err)
	}
	return ParseTopology(path, data)
}

// ParseTopology reads a topology file's contents; name is used in errors.
// Errors give the line and column of the offending key where TOML decoding
// fails, and the entry (gpu[1].instances[0]) where a value is wrong.
func ParseTopology(name string, data []byte) (*Topology, error) {
	var f topoFile
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, tomlError(name, data, err)
	}
	t := &Topology{Source: SourceFile, Path: name, Driver: f.Driver, GPUs: []GPU{}}
	t.MPS = MPS{Running: f.MPS.Running, PipeDir: f.MPS.PipeDir, Detail: "from the topology file"}
	seenIndex := map[int]bool{}
	seenUUID := map[string]string{}
	claim := func(uuid, where string) error {
		if uuid == "" {
			return nil
		}
		if prev, ok := seenUUID[uuid]; ok {
			return fmt.Errorf("gmi: topology file %s: %s: uuid %q already used by %s", name, where, uuid, prev)
		}
		seenUUID[uuid] = where
		return nil
	}
	for i, gf := range f.GPU {
		where := fmt.Sprintf("gpu[%d]", i)
		fail := func(format string, args ...any) (*Topology, error) {
			return nil, fmt.Errorf("gmi: topology file %s: %s: %s", name, where, fmt.Sprintf(format, args...))
		}
		g := GPU{Index: i, UUID: gf.UUID, Name: gf.Name, MemoryBytes: gf.MemoryMiB << 20, MIGMode: gf.MIG}
		if gf.Index != nil {
			g.Index = *gf.Index
		}
		if g.Index < 0 {
			return fail("index %d is negative", g.Index)
		}
		if seenIndex[g.Index] {
			return fail("index %d appears twice", g.Index)
		}
		seenIndex[g.Index] = true
		if err := claim(g.UUID, where); err != nil {
			return nil, err
		}
		if gf.ComputeCapability == "" {
			return fail("compute_capability missing (such as \"8.0\")")
		}
		cc, err := ParseComputeCapability(gf.ComputeCapability)
		if err != nil {
			return fail("%v", strings.TrimPrefix(err.Error(), "gmi: "))
		}
		g.Compute = cc
		if g.MIGMode && cc.SM() < 80 {
			return fail("mig = true on %s: MIG needs sm_80 or later", cc)
		}
		if !g.MIGMode && len(gf.Instances) > 0 {
			return fail("MIG instances listed but mig = false")
		}
		for j, mf := range gf.Instances {
			where := fmt.Sprintf("gpu[%d].instances[%d]", i, j)
			failMIG := func(format string, args ...any) (*Topology, error) {
				return nil, fmt.Errorf("gmi: topology file %s: %s: %s", name, where, fmt.Sprintf(format, args...))
			}
			p, err := ParseMIGProfile(mf.Profile)
			if err != nil {
				return failMIG("%v", strings.TrimPrefix(err.Error(), "gmi: "))
			}
			m := MIGInstance{UUID: mf.UUID, Profile: p.String(), GPUInstance: j, SMs: mf.SMs, MemoryBytes: mf.MemoryMiB << 20}
			if mf.GPUInstance != nil {
				m.GPUInstance = *mf.GPUInstance
			}
			if mf.ComputeInstance != nil {
				m.ComputeInstance = *mf.ComputeInstance
			}
			if m.GPUInstance < 0 || m.ComputeInstance < 0 {
				return failMIG("gi and ci must not be negative")
			}
			if m.UUID == "" && g.UUID == "" {
				return failMIG("uuid missing (a rank binds to a MIG instance by UUID)")
			}
			if err := claim(m.UUID, where); err != nil {
				return nil, err
			}
			for _, o := range g.MIG {
				if o.GPUInstance == m.GPUInstance && o.ComputeInstance == m.ComputeInstance {
					return failMIG("gi %d ci %d appears twice", m.GPUInstance, m.ComputeInstance)
				}
			}
			if m.UUID == "" {
				// The UUID a rank bound to it gets, shown as such (gearrun gpus).
				m.UUID, _ = g.visibleDevice(m)
			}
			g.MIG = append(g.MIG, m)
		}
		sortMIG(g.MIG)
		t.GPUs = append(t.GPUs, g)
	}
	slices.SortFunc(t.GPUs, func(a, b GPU) int { return a.Index - b.Index })
	return t, nil
}

func sortMIG(ms []MIGInstance) {
	slices.SortStableFunc(ms, func(a, b MIGInstance) int {
		if a.GPUInstance != b.GPUInstance {
			return a.GPUInstance - b.GPUInstance
		}
		return a.ComputeInstance - b.ComputeInstance
	})
}

// tomlError turns go-toml's errors into "gmi: topology file F:LINE:COL: ...",
// naming the key by its entry ("gpu[0].memory_mib: want uint64, got TOML
// string"), as the checks after decoding do.
func tomlError(name string, data []byte, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) && len(strict.Errors) > 0 {
		e := strict.Errors[0]
		line, col := e.Position()
		return fmt.Errorf("gmi: topology file %s:%d:%d: unknown key %s", name, line, col, tomlerr.Path(data, e.Key(), line))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, col, msg := tomlerr.Describe(de, data)
		return fmt.Errorf("gmi: topology file %s:%d:%d: %s", name, line, col, msg)
	}
	return fmt.Errorf("gmi: topology file %s: %w", name, err)
}
