package collective

// ShmBytes is the most shared memory that the world communicators of
// localRanks ranks on one host take together with tuning t: every rank's inbox
// holds a ring for each other rank of the host, and this is every ring full,
// with the host's board (a slot of 64 KiB per rank) full too.
// Rings shrink when many ranks share a host (Tuning.InboxBytes), so that it
// grows with the ranks, not with their pairs. Memory is taken only where frames
// go (ShmSetupBytes is what a communicator's setup touches), but launchers check
// this bound against the free space of /dev/shm before they start anything,
// since a ring's page that finds /dev/shm full kills the rank that touches it.
// A single rank takes none, and neither does a system without the
// shared-memory transport.
func ShmBytes(localRanks int, t Tuning) int64 {
	if localRanks < 2 || !shmAvailable() {
		return 0
	}
	ring, _ := t.shmSizes(localRanks)
	return int64(localRanks)*shmSegmentBytes(localRanks, ring) + boardBytes(localRanks)
}

// ShmBoardBytes is the part of ShmBytes that the host's board of localRanks
// ranks takes (the one-step AllReduce and Barrier of docs/collectives.md).
func ShmBoardBytes(localRanks int) int64 {
	if localRanks < 2 || !shmAvailable() {
		return 0
	}
	return boardBytes(localRanks)
}

// ShmSetupBytes is the shared memory that setting up the world communicators
// of localRanks ranks on one host takes: the control blocks of their inboxes.
// Frames add the pages of the rings they cross; a small message between two
// ranks, a page or two.
func ShmSetupBytes(localRanks int) int64 {
	if localRanks < 2 || !shmAvailable() {
		return 0
	}
	return int64(localRanks) * shmCtlBytes(localRanks)
}

// ShmRingBytes is the capacity of one shared-memory ring of a communicator
// whose largest host has localRanks ranks, with tuning t.
func ShmRingBytes(localRanks int, t Tuning) int {
	ring, _ := t.shmSizes(localRanks)
	return ring
}

// ShmUsage reports this rank's shared-memory inbox of c: its size (every ring
// of it) and the bytes of it that the host holds now, which are the pages that
// setup and frames touched. Summed over the ranks of a host, resident is the
// shared memory the communicator takes there. Zero without shared memory; a
// resident of -1 means the kernel would not say.
func (c *Comm) ShmUsage() (size, resident int64) {
	for _, t := range c.trans {
		if st, ok := t.(*shmTransport); ok {
			return st.usage()
		}
	}
	return 0, 0
}
