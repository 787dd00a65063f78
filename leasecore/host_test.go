package leasecore

import (
	"os"
	"testing"
)

func TestHostname(t *testing.T) {
	t.Parallel()
	h := Hostname()
	if h == "" {
		t.Fatal("Hostname is empty")
	}
	if want, err := os.Hostname(); err == nil && want != "" && h != want {
		t.Errorf("Hostname() = %q, want %q from os.Hostname", h, want)
	}
}
