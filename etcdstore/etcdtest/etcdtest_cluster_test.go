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

// leaderOf returns the index of the member of servers that leads, waiting
// at most 10 s for one; -1 when none does.
func leaderOf(servers []*Server) int {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for i, s := range servers {
			if s.IsLeader() {
				return i
			}
		}
	}
	return -1
}

// TestKillAndRestart kills the leader (no leadership transfer): another
// member leads after an election, and the killed member rejoins when it
// restarts, so that a cluster survives any number of killed leaders.
func TestKillAndRestart(t *testing.T) {
	servers := StartCluster(t, 3)
	for round := range 2 {
		leader := leaderOf(servers)
		if leader < 0 {
			t.Fatal("no member leads")
		}
		start := time.Now()
		servers[leader].Kill()
		t.Logf("round %d: killed m%d in %v", round, leader, time.Since(start).Round(time.Millisecond))
		next := leaderOf(servers)
		if next < 0 || next == leader {
			t.Fatalf("round %d: leader after the kill of m%d: %d", round, leader, next)
		}
		t.Logf("round %d: m%d leads %v after the kill", round, next, time.Since(start).Round(time.Millisecond))
		servers[leader].Restart(t)
	}
}
