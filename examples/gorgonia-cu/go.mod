module github.com/gear-rl/gear/examples/gorgonia-cu

go 1.26.8

require (
	github.com/gear-rl/gear v0.0.0
	gorgonia.org/cu v0.9.6
)

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
)

replace github.com/gear-rl/gear => ../..
