package rank

import (
	"log/slog"
	"maps"
	"time"
)

// Option changes how Init joins the world.
type Option func(*initConfig)

type initConfig struct {
	info      *Info
	log       *slog.Logger
	endpoints map[string]string
	timeout   time.Duration
	hostID    string
	heartbeat time.Duration
}

// WithInfo joins with info instead of reading the environment (FromEnv).
func WithInfo(info Info) Option { return func(c *initConfig) { c.info = &info } }

// WithLogger sends the world's logs to l (default: discarded).
func WithLogger(l *slog.Logger) Option { return func(c *initConfig) { c.log = l } }

// WithEndpoints registers small facts (listen addresses, segment names) that every
// rank sees in Peers once the world assembles.
func WithEndpoints(ep map[string]string) Option {
	return func(c *initConfig) { c.endpoints = maps.Clone(ep) }
}

// WithTimeout overrides Info.RdzvTimeout: how long Init waits for the world.
func WithTimeout(d time.Duration) Option { return func(c *initConfig) { c.timeout = d } }

// WithHostID overrides the host identity (HostID).
func WithHostID(id string) Option { return func(c *initConfig) { c.hostID = id } }

// WithHeartbeatTimeout sets how long the rank waits for a word from the
// coordinator (which pings every DefaultHeartbeat) before it takes it for gone;
// the default is DefaultHeartbeatTimeout. It must exceed the coordinator's
// heartbeat interval.
func WithHeartbeatTimeout(d time.Duration) Option { return func(c *initConfig) { c.heartbeat = d } }
