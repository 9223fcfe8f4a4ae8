package main

import "io"

func benchSample(args []string, out io.Writer) error  { return errNotYet }
func benchCollect(args []string, out io.Writer) error { return errNotYet }
