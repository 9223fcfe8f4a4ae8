module example.com/external

go 1.26.8

require github.com/gear-rl/gear v0.0.0

require (
	github.com/NVIDIA/go-nvml v0.13.3-0 // indirect
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pelletier/go-toml/v2 v2.4.3 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

// This copy builds against the repository that holds it; a user's module
// leaves this line out and requires a released version.
replace github.com/gear-rl/gear => ../..
