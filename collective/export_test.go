package collective

// BoardBytes is the largest AllReduce, in bytes, that c runs on the host's
// board (0: c does not use the board), for tests that must know a call took
// the board.
func (c *Comm) BoardBytes() int { return c.boardMax }

// PrefaultChunk is how much of a ring's first pass a rank maps at a time.
const PrefaultChunk = prefaultChunk
