package jobs

import (
	"testing"
	"time"
)

// TestClusterStampsWithItsClock pins Cluster.Clock as the clock of the
// records: a prepared job was submitted at the clock's reading, in UTC.
func TestClusterStampsWithItsClock(t *testing.T) {
	at := time.Date(2001, 2, 3, 4, 5, 6, 0, time.FixedZone("x", 3600))
	c := &Cluster{State: StateDir(t.TempDir()), Gearrun: "/opt/gear/bin/gearrun", Clock: func() time.Time { return at }}
	p, err := c.Prepare(loadExample(t, "hello.toml"), "hello.toml", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Record.SubmittedAt; !got.Equal(at) || got.Location() != time.UTC {
		t.Fatalf("SubmittedAt = %v, want the cluster's clock %v in UTC", got, at)
	}
}
