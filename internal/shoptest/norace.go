//go:build !race

package shoptest

const raceEnabled = false
