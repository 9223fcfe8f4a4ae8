package gpulearn

// Layout is the row of one transition, in 4-byte words: the observation
// (ObsSize float32), the next observation (ObsSize float32), the action
// (int32), the reward and the discount (float32), padded to a multiple of four
// words so that rows are 16-byte aligned for the zero-copy gather.
type Layout struct {
	ObsSize int
}

// Next is the word where the next observation starts.
func (l Layout) Next() int { return l.ObsSize }

// Action is the word of the action.
func (l Layout) Action() int { return 2 * l.ObsSize }

// Reward is the word of the reward.
func (l Layout) Reward() int { return 2*l.ObsSize + 1 }

// Discount is the word of the discount.
func (l Layout) Discount() int { return 2*l.ObsSize + 2 }

// Words is the row's length in words.
func (l Layout) Words() int { return (2*l.ObsSize + 3 + 3) / 4 * 4 }

// Bytes is the row's length in bytes.
func (l Layout) Bytes() int { return 4 * l.Words() }
