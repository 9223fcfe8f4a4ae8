package main

import "io"

func benchStore(args []string, out io.Writer) error { return errNotYet }
