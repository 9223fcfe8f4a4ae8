// Package gmi discovers GPUs, MIG and MPS instances, plans ranks onto GPU
// multiplexing instances (GMIs) and chooses the reduction strategy.
package gmi
