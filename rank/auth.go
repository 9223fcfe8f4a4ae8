package rank

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"maps"
	"slices"
)

// A rank proves that it knows the job token without sending it: the coordinator
// sends a fresh nonce, the rank answers with HMAC-SHA256(token, client label,
// server nonce, client nonce, job ID, rank), and the coordinator answers with
// HMAC-SHA256(token, server label, client nonce, server nonce) so that the rank
// knows it reached the job's own coordinator. Proofs are compared in constant time.

const (
	clientLabel = "gear rdzv client v1"
	serverLabel = "gear rdzv server v1"
)

func clientProof(token string, serverNonce, clientNonce []byte, jobID string, rank int) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(clientLabel))
	m.Write(serverNonce)
	m.Write(clientNonce)
	m.Write(binary.AppendUvarint(nil, uint64(len(jobID))))
	m.Write([]byte(jobID))
	m.Write(binary.AppendUvarint(nil, uint64(rank)))
	return m.Sum(nil)
}

func serverProof(token string, serverNonce, clientNonce []byte) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(serverLabel))
	m.Write(clientNonce)
	m.Write(serverNonce)
	return m.Sum(nil)
}

func newNonce() [nonceSize]byte {
	var n [nonceSize]byte
	rand.Read(n[:]) // crypto/rand.Read never fails on Linux
	return n
}

// NewToken returns a fresh per-job secret: 32 random bytes, base64url encoded.
func NewToken() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
