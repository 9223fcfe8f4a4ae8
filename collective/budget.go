package collective

// ShmBytes is the shared memory that the communicators of localRanks ranks on
// one host take together with tuning t: every rank's inbox holds a ring for
// each rank of the host. Launchers check it against the free space of
// /dev/shm before they start anything. A single rank takes none, and neither
// does a system without the shared-memory transport.
func ShmBytes(localRanks int, t Tuning) int64 {
	if localRanks < 2 || !shmAvailable() {
		return 0
	}
	return int64(localRanks) * shmSegmentBytes(localRanks, t.RingBytes)
}
