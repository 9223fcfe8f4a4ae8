package store

// SetCommittingHook makes every commit call f after reserving its insertion
// sequence and before publishing the row (nil removes the hook). Only child
// processes of the tests set it, before any commit.
func SetCommittingHook(f func()) { testHookCommitting = f }
