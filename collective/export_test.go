package collective

// BoardBytes is the largest AllReduce, in bytes, that c runs on the host's
// board (0: c does not use the board), for tests that must know a call took
// the board.
func (c *Comm) BoardBytes() int { return c.boardMax }
