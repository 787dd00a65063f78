// Package leaktest fails a test binary whose goroutines outlive its tests,
// for packages that start goroutines of their own. goleak is not a
// dependency of the module, so it looks for a named frame in a dump of all
// goroutines instead.
package leaktest

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// Main runs the tests of m, then exits 1 if a goroutine is still inside
// the function frame names (as it appears in a stack dump, e.g.
// "fusefs.(*FS).Run("), after waiting up to a second for goroutines on
// their way out. Call it from TestMain.
func Main(m *testing.M, frame string) {
	code := m.Run()
	if code == 0 {
		if leak := leaked(frame); leak != "" {
			fmt.Fprintf(os.Stderr, "a goroutine in %s outlived the tests:\n%s\n", frame, leak)
			code = 1
		}
	}
	os.Exit(code)
}

// leaked returns the stack of a goroutine still inside frame.
func leaked(frame string) string {
	deadline := time.Now().Add(time.Second)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leak string
		for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
			if bytes.Contains(g, []byte(frame)) {
				leak = string(g)
				break
			}
		}
		if leak == "" || time.Now().After(deadline) {
			return leak
		}
		time.Sleep(10 * time.Millisecond)
	}
}
