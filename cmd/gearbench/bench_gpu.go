package main

import "io"

func benchGPU(args []string, out io.Writer) error { return errNotYet }
