// Package sortpar sorts large slices on two cores.
package sortpar

import "slices"

// parallelSortMin is the number of elements from which Sort sorts
// on two goroutines: below it, starting one costs more than it saves.
const parallelSortMin = 4096

// Sort sorts s by cmp, as [slices.SortFunc] does (not stable). From
// parallelSortMin elements it sorts the two halves at once and merges them
// through a buffer of len(s): loading and listing 100,000 leases sorts
// 100,000 names, most of whose time goes to comparing them, and the
// machine has a second core.
func Sort[T any](s []T, cmp func(a, b T) int) {
	if len(s) < parallelSortMin {
		slices.SortFunc(s, cmp)
		return
	}
	lo, hi := slices.Clone(s[:len(s)/2]), slices.Clone(s[len(s)/2:])
	done := make(chan struct{})
	go func() {
		defer close(done)
		slices.SortFunc(hi, cmp)
	}()
	slices.SortFunc(lo, cmp)
	<-done
	for i := range s {
		if len(hi) == 0 || len(lo) > 0 && cmp(lo[0], hi[0]) <= 0 {
			s[i], lo = lo[0], lo[1:]
		} else {
			s[i], hi = hi[0], hi[1:]
		}
	}
}
