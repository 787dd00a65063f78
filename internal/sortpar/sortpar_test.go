package sortpar

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestSortParallel: Sort sorts as slices.SortFunc does, below and
// above the size from which it uses two goroutines.
func TestSortParallel(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 7, parallelSortMin - 1, parallelSortMin, 3*parallelSortMin + 1} {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprintf("%04x", rand.IntN(1<<12)) // short: many equal keys
		}
		want := slices.Clone(s)
		slices.Sort(want)
		Sort(s, strings.Compare)
		if !slices.Equal(s, want) {
			t.Errorf("n=%d: not sorted", n)
		}
	}
}
