package etcdtest

import (
	"testing"
	"time"
)

// TestStartCluster starts three members: exactly one leads, and a new
// leader is elected after it stops.
func TestStartCluster(t *testing.T) {
	servers := StartCluster(t, 3)
	leader := -1
	for i, s := range servers {
		if s.IsLeader() {
			if leader >= 0 {
				t.Fatalf("members %d and %d both lead", leader, i)
			}
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no member leads")
	}
	servers[leader].Stop()
	deadline := time.Now().Add(10 * time.Second)
	for !servers[(leader+1)%3].IsLeader() && !servers[(leader+2)%3].IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no new leader 10s after the leader stopped")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
