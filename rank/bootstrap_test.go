package rank_test

import (
	"gear/collective"
	"gear/rank"
)

// World is the bootstrap that communicators are built on.
var _ collective.Bootstrap = (*rank.World)(nil)
