// Package launch turns a launch request into a plan (plain data that --dry-run
// prints), spawns one process per rank with the rank contract in its environment,
// binds devices, tags and routes output, fails fast and forwards signals.
package launch
