package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// synthetic builds histories for the checker's own tests: times are in
// milliseconds from the start of the run.
type synthetic struct {
	h   *opHistory
	seq map[int]int
}

func newSynthetic(crashes ...int64) *synthetic {
	h := &opHistory{lease: 2 * time.Second, start: 1, end: 1 + 100_000*int64(time.Millisecond), clients: map[int]*clientInfo{}}
	for _, c := range crashes {
		h.crashes = append(h.crashes, 1+c*int64(time.Millisecond))
	}
	h.crashRun = len(crashes) > 0
	return &synthetic{h: h, seq: map[int]int{}}
}

// op appends an operation of client c called at call ms and returned at ret
// ms (ret < 0: pending).
func (s *synthetic) op(c int, op, name, mode, lease string, gen uint64, call, ret int64, result string) *histOp {
	if s.h.clients[c] == nil {
		s.h.clients[c] = &clientInfo{id: c, kind: "go"}
	}
	s.seq[c]++
	o := &histOp{client: c, seq: s.seq[c], op: op, name: name, mode: mode, lease: lease, gen: gen,
		call: 1 + call*int64(time.Millisecond), result: result}
	if ret >= 0 {
		o.ret = 1 + ret*int64(time.Millisecond)
	} else {
		o.result = ""
	}
	s.h.ops = append(s.h.ops, o)
	return o
}

// TestReliabilityCheckerCatchesViolations feeds the checker histories with one
// planted violation each (and clean ones) and checks that it reports exactly
// the planted rule: a checker that never fails proves nothing.
func TestReliabilityCheckerCatchesViolations(t *testing.T) {
	cases := []struct {
		name   string
		build  func(s *synthetic)
		rules  []string // expected violation rules; none: a clean history
		porcup bool     // porcupine must find it illegal
	}{
		{
			name: "clean handoff between token and handle leases",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(0, "renew", "a", "token", "L1", 1, 500, 510, "ok")
				s.op(0, "rel", "a", "token", "L1", 1, 900, 910, "ok")
				s.op(1, "acq", "a", "flock", "-", 0, 100, 110, "EWOULDBLOCK")
				s.op(1, "acq", "a", "flock", "L2", 2, 905, 920, "ok")
				s.op(1, "check", "a", "flock", "L2", 2, 1000, 1010, "ok")
				s.op(1, "rel", "a", "flock", "L2", 2, 1100, 1110, "ok")
				s.op(2, "acq", "b", "token", "L3", 3, 1000, 1010, "ok")
			},
		},
		{
			name: "stalled holder refused, successor takes over after expiry",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(1, "acq", "a", "token", "L2", 2, 2100, 2110, "ok")
				s.op(0, "renew", "a", "token", "L1", 1, 3000, 3010, "ESTALE")
				s.op(0, "renew", "a", "token", "L1", 1, 3020, 3030, "ESTALE")
			},
		},
		{
			name: "successor granted while a token lease is still live",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(0, "renew", "a", "token", "L1", 1, 1000, 1010, "ok")
				s.op(1, "acq", "a", "token", "L2", 2, 2100, 2110, "ok") // L1 lives until 3000
			},
			rules: []string{"two holders"},
		},
		{
			name: "two handle holders at once",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "flock", "L1", 1, 0, 10, "ok")
				s.op(1, "acq", "a", "lockf", "L2", 2, 20, 30, "ok")
				s.op(0, "rel", "a", "flock", "L1", 1, 500, 510, "ok")
			},
			rules: []string{"two holders"},
		},
		{
			name: "handle lease of a killed daemon does not overlap its successor",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "flock", "L1", 1, 0, 10, "ok")
				s.op(0, "check", "a", "flock", "L1", 1, 600, 610, "ENOTCONN")
				s.op(1, "acq", "a", "flock", "L2", 2, 700, 710, "ok")
			},
		},
		{
			name: "handle lease granted just before a killed daemon died",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "flockfd", "L1", 1, 450, 510, "ok") // crash at 500, return stamped after
				s.op(0, "check", "a", "flockfd", "L1", 1, 600, 610, "ENOTCONN")
				s.op(1, "acq", "a", "flock", "L2", 2, 700, 710, "ok")
				s.op(0, "rel", "a", "flockfd", "L1", 1, 800, 810, "ENOTCONN")
			},
		},
		{
			name: "generation goes back",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 5, 0, 10, "ok")
				s.op(0, "rel", "a", "token", "L1", 5, 100, 110, "ok")
				s.op(1, "acq", "b", "token", "L2", 4, 200, 210, "ok")
			},
			rules: []string{"generation not increasing"},
		},
		{
			name: "generation goes back on one name",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 5, 0, 10, "ok")
				s.op(0, "rel", "a", "token", "L1", 5, 100, 110, "ok")
				s.op(1, "acq", "a", "token", "L2", 4, 200, 210, "ok")
			},
			rules:  []string{"generation not increasing"},
			porcup: true,
		},
		{
			name: "refused renew followed by a successful one",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(0, "renew", "a", "token", "L1", 1, 2500, 2510, "ESTALE")
				s.op(0, "renew", "a", "token", "L1", 1, 2520, 2530, "ok")
			},
			rules:  []string{"refused lease resurrected", "expired lease renewed"},
			porcup: true,
		},
		{
			name: "stalled holder's late renew accepted",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(0, "renew", "a", "token", "L1", 1, 3000, 3010, "ok")
			},
			rules: []string{"expired lease renewed"},
		},
		{
			name: "stale holder renews after its successor was granted",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(1, "acq", "a", "token", "L2", 2, 2100, 2110, "ok")
				s.op(0, "renew", "a", "token", "L1", 1, 2200, 2210, "ok")
			},
			rules:  []string{"expired lease renewed", "two holders"},
			porcup: true,
		},
		{
			name: "released lease renewed",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(0, "rel", "a", "token", "L1", 1, 100, 110, "ok")
				s.op(0, "renew", "a", "token", "L1", 1, 200, 210, "ok")
			},
			rules:  []string{"released lease renewed"},
			porcup: true,
		},
		{
			name: "lease granted twice",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(1, "acq", "b", "token", "L1", 1, 0, 10, "ok")
			},
			rules: []string{"lease granted twice"},
		},
		{
			name: "handle lease lost while held",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "flock", "L1", 1, 0, 10, "ok")
				s.op(0, "check", "a", "flock", "L1", 1, 100, 110, "ESTALE")
			},
			rules: []string{"unexpected result"},
		},
		{
			name: "EIO from the kernel as the killed daemon died",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "ofd", "-", 0, 495, 510, "EIO") // crash at 500
				s.op(1, "acq", "a", "flock", "L2", 2, 700, 710, "ok")
			},
		},
		{
			name: "EIO long after the killed daemon died",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "ofd", "-", 0, 2000, 2010, "EIO") // crash at 500
			},
			rules: []string{"unexpected result"},
		},
		{
			name: "token read after its lease expired in a stall",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "-", 0, 0, 2500, "notoken")
			},
		},
		{
			name: "no token in a quick reservation",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "-", 0, 0, 10, "notoken")
			},
			rules: []string{"unexpected result"},
		},
		{
			name: "pending operations are not judged",
			build: func(s *synthetic) {
				s.op(0, "acq", "a", "token", "L1", 1, 0, 10, "ok")
				s.op(0, "renew", "a", "token", "L1", 1, 2500, -1, "")
				s.op(1, "acq", "a", "token", "-", 0, 2600, -1, "")
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSynthetic()
			if strings.Contains(tc.name, "killed daemon") || strings.Contains(tc.name, "daemon died") {
				s = newSynthetic(500)
			}
			tc.build(s)
			r := s.h.check("")
			got := map[string]bool{}
			for _, v := range r.violations {
				got[v.rule] = true
			}
			for _, rule := range tc.rules {
				if !got[rule] {
					t.Errorf("missing violation %q; got:\n%s", rule, r.describe(20))
				}
				delete(got, rule)
			}
			delete(got, "not linearizable")
			for rule := range got {
				t.Errorf("unexpected violation %q:\n%s", rule, r.describe(20))
			}
			if tc.porcup && r.linearizable != "Illegal" {
				t.Errorf("porcupine: %s, want Illegal", r.linearizable)
			}
			if len(tc.rules) == 0 && r.linearizable != "Ok" {
				t.Errorf("porcupine: %s on a clean history", r.linearizable)
			}
		})
	}
}

// TestReliabilityLogParsing checks the log format shared by the three
// clients, including a torn last line.
func TestReliabilityLogParsing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.log")
	log := strings.Join([]string{
		"B 1 acq n0 token - 0 100 1700000000000000000",
		"E 1 ok lease-x 7 200 hwl_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		"B 2 renew n0 token lease-x 7 300 1700000000000000100",
		"E 2 ESTALE lease-x 7 400 -",
		"B 3 rel n0 token lease-x 7 500 1700000000000000200",
		"E 3 ok lease-x 7 600 complete",
		"B 4 renew n0 token lease-x 7 700 17000",
		"E 4 ES", // torn by SIGKILL
	}, "\n")
	if err := os.WriteFile(p, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	ops, err := parseClientLog(&clientInfo{id: 3, log: p})
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 4 {
		t.Fatalf("%d operations, want 4", len(ops))
	}
	if o := ops[0]; o.lease != "lease-x" || o.gen != 7 || o.call != 100 || o.ret != 200 || o.token == "" || o.client != 3 {
		t.Errorf("acq parsed as %+v", o)
	}
	if o := ops[2]; o.action != "complete" || o.result != "ok" {
		t.Errorf("rel parsed as %+v", o)
	}
	if !ops[3].pending() {
		t.Errorf("an operation without E line is not pending: %+v", ops[3])
	}
}
