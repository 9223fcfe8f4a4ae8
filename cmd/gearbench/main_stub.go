package main

import "errors"

// errNotYet marks a benchmark whose package has not landed yet.
var errNotYet = errors.New("not built yet")
