package sample

import (
	"context"
	"testing"
	"time"
)

// TestTableStampsWithItsClock pins Config.Clock as the table's clock: an
// insert's Item.Inserted is the clock's reading in unix nanoseconds.
func TestTableStampsWithItsClock(t *testing.T) {
	at := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	tb, err := NewTable(Config{Name: "clock", MaxSize: 4, Sampler: NewUniform(), Remover: NewFIFO(),
		Clock: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	if err := tb.Insert(context.Background(), 7, 1, 7); err != nil {
		t.Fatal(err)
	}
	it, ok := tb.Get(7)
	if !ok || it.Inserted != at.UnixNano() {
		t.Fatalf("Get(7) = %+v, %v; want Inserted %d (the table's clock)", it, ok, at.UnixNano())
	}
}
