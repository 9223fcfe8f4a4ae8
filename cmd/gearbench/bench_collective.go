package main

import "io"

func benchAllReduce(args []string, out io.Writer) error     { return errNotYet }
func benchBroadcast(args []string, out io.Writer) error     { return errNotYet }
func benchAllGather(args []string, out io.Writer) error     { return errNotYet }
func benchReduceScatter(args []string, out io.Writer) error { return errNotYet }
func benchAllToAll(args []string, out io.Writer) error      { return errNotYet }
