package rank_test

import (
	"github.com/gear-rl/gear/collective"
	"github.com/gear-rl/gear/rank"
)

// World is the bootstrap that communicators are built on.
var _ collective.Bootstrap = (*rank.World)(nil)
