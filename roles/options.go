package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/internal/errmark"
	"github.com/gear-rl/gear/internal/shmname"
)

// Transport chooses how a stream's ends talk.
type Transport string

const (
	// TransportAuto uses shared memory between ranks of one host (equal
	// Bootstrap.Host) and TCP between hosts.
	TransportAuto Transport = ""
	// TransportTCP uses TCP everywhere; servers create no shared memory.
	TransportTCP Transport = "tcp"
	// TransportShm uses shared memory only: a client on another host is refused.
	TransportShm Transport = "shm"
)

// Option changes how a stream end is built. Both ends of a stream should be
// given the same transport.
type Option func(*config)

type config struct {
	transport  Transport
	listenHost string
	spin       time.Duration
	spinSet    bool
}

// WithTransport forces a transport (default TransportAuto).
func WithTransport(t Transport) Option { return func(c *config) { c.transport = t } }

// WithListenHost sets the address (host name or IP) on which a server accepts TCP
// connections: it must be reachable from the other hosts of the world. The default
// is the Bootstrap's ListenHost, if it has one, else 127.0.0.1.
func WithListenHost(host string) Option { return func(c *config) { c.listenHost = host } }

// WithSpin sets how long a shared-memory wait polls before it sleeps on a futex
// (default 20µs; 0 sleeps at once, which suits hosts with fewer cores than busy
// ranks).
func WithSpin(d time.Duration) Option {
	return func(c *config) { c.spin, c.spinSet = d, true }
}

const defaultSpin = 20 * time.Microsecond

// Optional Bootstrap capabilities, found by type assertion (rank.World and
// collectivetest's bootstrap have JobID).
type (
	jobIDBootstrap      interface{ JobID() string }
	listenHostBootstrap interface{ ListenHost() string }
)

func buildConfig(b collective.Bootstrap, opts []Option) (config, error) {
	c := config{spin: defaultSpin}
	for _, o := range opts {
		o(&c)
	}
	switch c.transport {
	case TransportAuto, TransportTCP, TransportShm:
	default:
		return c, fmt.Errorf("roles: unknown transport %q (want \"\", %q or %q)", c.transport, TransportTCP, TransportShm)
	}
	if c.spin < 0 {
		return c, fmt.Errorf("roles: spin %v is negative", c.spin)
	}
	if c.listenHost == "" {
		if lh, ok := b.(listenHostBootstrap); ok {
			c.listenHost = lh.ListenHost()
		}
		if c.listenHost == "" {
			c.listenHost = "127.0.0.1"
		}
	}
	return c, nil
}

// segmentName names a role channel's shared-memory segment (shmname.Roles,
// removed between a restarted job's generations): "gear.<job>.roles.<rest>",
// with the Bootstrap's job ID, else this process's.
func segmentName(b collective.Bootstrap, rest string) string {
	job := shmname.LocalJobID()
	if j, ok := b.(jobIDBootstrap); ok && j.JobID() != "" {
		job = j.JobID()
	}
	return shmname.Make(job, shmname.Roles, rest)
}

// checkName accepts stream names made of letters, digits, '-', '_' and '.': they
// become parts of keys and of shared-memory segment names.
func checkName(kind, name string) error {
	if name == "" || len(name) > 64 {
		return errmark.Errorf(ErrInvalid, "roles: %s name %q: want 1 to 64 letters, digits, '-', '_' or '.'", kind, name)
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
		if !ok {
			return errmark.Errorf(ErrInvalid, "roles: %s name %q: want 1 to 64 letters, digits, '-', '_' or '.'", kind, name)
		}
	}
	return nil
}

// Keys of the key-value exchange. Each server publishes one endpoint.
func inferKey(name string, r int) string  { return "roles/infer/" + name + "/" + strconv.Itoa(r) }
func sampleKey(name string, r int) string { return "roles/sample/" + name + "/" + strconv.Itoa(r) }
func paramKey(name string) string         { return "roles/param/" + name }

// endpoint is what a server publishes under its key.
type endpoint struct {
	Rank  int    `json:"rank"`
	Host  string `json:"host"`
	PID   int    `json:"pid"`
	Shm   string `json:"shm,omitempty"` // segment name; "" without shared memory
	TCP   string `json:"tcp,omitempty"` // host:port; "" without TCP
	Nonce []byte `json:"nonce,omitempty"`
	// Stream geometry, so that clients need no configuration of their own.
	Obs    int `json:"obs,omitempty"`
	Act    int `json:"act,omitempty"`
	Slots  int `json:"slots,omitempty"`
	ReqObs int `json:"req_obs,omitempty"` // observations per inference request; 0 is 1
	Floats int `json:"floats,omitempty"`
	Ring   int `json:"ring,omitempty"`
	Record int `json:"record,omitempty"`
}

func publish(ctx context.Context, b collective.Bootstrap, key string, ep endpoint) error {
	v, err := json.Marshal(ep)
	if err != nil {
		return fmt.Errorf("roles: encode endpoint %s: %w", key, err)
	}
	if err := b.Set(ctx, key, v); err != nil {
		return fmt.Errorf("roles: publish endpoint %s: %w", key, err)
	}
	return nil
}

func lookup(ctx context.Context, b collective.Bootstrap, key string) (endpoint, error) {
	v, err := b.Wait(ctx, key)
	if err != nil {
		return endpoint{}, fmt.Errorf("roles: wait for endpoint %s: %w", key, err)
	}
	var ep endpoint
	if err := json.Unmarshal(v, &ep); err != nil {
		return endpoint{}, fmt.Errorf("roles: endpoint %s: %w", key, err)
	}
	return ep, nil
}

// useShm says whether a client should map the server's segment: same host, the
// server made one, and the transport allows it. It fails when shared memory is
// required but impossible.
func useShm(c config, b collective.Bootstrap, ep endpoint, key string) (bool, error) {
	local := ep.Host == b.Host() && ep.Shm != ""
	switch c.transport {
	case TransportTCP:
		if ep.TCP == "" {
			return false, fmt.Errorf("roles: endpoint %s has no TCP address (the server uses shared memory only)", key)
		}
		return false, nil
	case TransportShm:
		if !local {
			return false, fmt.Errorf("roles: endpoint %s: shared memory required, but the server (rank %d on host %q) has none for host %q", key, ep.Rank, ep.Host, b.Host())
		}
		return true, nil
	}
	if !local && ep.TCP == "" {
		return false, fmt.Errorf("roles: endpoint %s: the server (rank %d on host %q) offers shared memory only, and this rank is on host %q", key, ep.Rank, ep.Host, b.Host())
	}
	return local, nil
}
