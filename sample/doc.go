// Package sample implements Reverb's selectors and rate limiters, the replay table
// over GEAR shards, distributed selection and collection.
package sample
