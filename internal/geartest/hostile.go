package geartest

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// Kinds of hostile rendezvous clients, for tests of the coordinator (Hostile).
const (
	// HostileGarbage sends an HTTP request.
	HostileGarbage = iota
	// HostileOversized sends a frame header announcing 16 MiB, then 1 MiB.
	HostileOversized
	// HostileWrongProof sends a well-formed auth frame (69 bytes of type 17:
	// nonce, rank 0, proof) whose proof is random.
	HostileWrongProof
	// HostileIdle sends nothing.
	HostileIdle
	// HostileKinds is the number of kinds.
	HostileKinds
)

var oneMiB = make([]byte, 1<<20)

// Hostile connects to the rendezvous coordinator at addr as a client of the
// given kind and reads until the coordinator drops the connection; it fails if
// that takes longer than limit. A reset connection counts as dropped.
func Hostile(addr string, kind int, limit time.Duration) error {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(limit))
	switch kind {
	case HostileGarbage:
		nc.Write([]byte("GET / HTTP/1.1\r\nHost: gear\r\n\r\n"))
	case HostileOversized:
		nc.Write([]byte{0x01, 0x00, 0x00, 0x00, 2})
		nc.Write(oneMiB)
	case HostileWrongProof:
		f := binary.BigEndian.AppendUint32(nil, 69)
		f = append(f, 17)
		body := make([]byte, 68)
		rand.Read(body)
		binary.BigEndian.PutUint32(body[32:], 0)
		nc.Write(append(f, body...))
	}
	_, err = io.Copy(io.Discard, nc)
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return nil
	}
	return err
}

// HostileFlood opens n hostile connections to addr, cycling through the kinds,
// at most parallel at a time, and returns the errors of those the coordinator
// did not drop within limit.
func HostileFlood(addr string, n, parallel int, limit time.Duration) []error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, parallel)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := Hostile(addr, i%HostileKinds, limit); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("hostile connection %d (kind %d): %w", i, i%HostileKinds, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}
