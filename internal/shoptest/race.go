//go:build race

package shoptest

// raceEnabled: this test binary has the race detector, so the shop
// processes it starts get it too.
const raceEnabled = true
