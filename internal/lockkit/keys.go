package lockkit

import "slices"

func sortedUnique(keys []string) []string {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	return slices.Compact(sorted)
}
