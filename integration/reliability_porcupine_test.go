package integration

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// This file is the linearizability half of the reliability checker: the
// history of reliability_model_test.go against a sequential lease model,
// checked by porcupine.

// leaseInput and leaseOutput are the operations of [leaseModel].
type leaseInput struct {
	op  string // acq, renew (token renew or handle check), rel
	gen uint64
}

type leaseOutput struct{ ok bool }

// leaseState is the state of one name in [leaseModel]: the largest generation
// granted so far and the generation of the lease that may still be used
// (0: none — released, refused, or superseded by a newer grant).
type leaseState struct{ last, holder uint64 }

// leaseModel is the sequential specification of one name, partitioned by
// name. A successful acquire must return a generation larger than every
// generation granted before it (fencing monotonicity) and supersedes the
// previous lease; a renew, a status check through a handle lease, or a
// release succeeds only on the lease granted last and not yet released or
// refused. A refused renew (ESTALE) ends the lease. Expiry and the kernel's
// release of a dead holder's locks are not operations: they need no step,
// because the next grant supersedes the lease anyway.
var leaseModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byName := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range history {
			name := op.Metadata.(*histOp).name
			if _, ok := byName[name]; !ok {
				names = append(names, name)
			}
			byName[name] = append(byName[name], op)
		}
		slices.Sort(names)
		var out [][]porcupine.Operation
		for _, n := range names {
			out = append(out, byName[n])
		}
		return out
	},
	Init: func() any { return leaseState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(leaseState), input.(leaseInput), output.(leaseOutput)
		switch {
		case in.op == "acq":
			return in.gen > s.last, leaseState{last: in.gen, holder: in.gen}
		case !out.ok: // refused renew
			if s.holder == in.gen {
				s.holder = 0
			}
			return true, s
		case in.op == "renew":
			return s.holder == in.gen, s
		case in.op == "rel":
			return s.holder == in.gen, leaseState{last: s.last}
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(leaseInput), output.(leaseOutput)
		res := "ok"
		if !out.ok {
			res = "ESTALE"
		}
		return fmt.Sprintf("%s(gen %d) -> %s", in.op, in.gen, res)
	},
	DescribeState: func(state any) string {
		s := state.(leaseState)
		return fmt.Sprintf("last %d, usable %d", s.last, s.holder)
	},
	DescribeOperationMetadata: func(info any) string { return info.(*histOp).String() },
}

// porcupineOps converts the history for [leaseModel]. Operations whose outcome
// is unknown (pending, or cut by a daemon crash), failed acquisitions (which
// change nothing) and handle releases (asynchronous in the kernel) are left
// out; leaving out an operation can only hide a violation, never invent one.
func (h *opHistory) porcupineOps() []porcupine.Operation {
	var ops []porcupine.Operation
	add := func(o *histOp, in leaseInput, ok bool) {
		ops = append(ops, porcupine.Operation{ClientId: o.client, Input: in, Output: leaseOutput{ok}, Call: o.call, Return: o.ret, Metadata: o})
	}
	for _, o := range h.ops {
		if o.pending() || o.gen == 0 {
			continue
		}
		switch {
		case o.op == "acq" && o.result == "ok":
			add(o, leaseInput{"acq", o.gen}, true)
		case (o.op == "renew" || o.op == "check") && o.result == "ok":
			add(o, leaseInput{"renew", o.gen}, true)
		case o.op == "renew" && o.result == "ESTALE":
			add(o, leaseInput{"renew", o.gen}, false)
		case o.op == "rel" && o.mode == "token" && o.result == "ok":
			add(o, leaseInput{"rel", o.gen}, true)
		}
	}
	return ops
}

// checkLinearizable checks the history against [leaseModel] with porcupine.
func (h *opHistory) checkLinearizable(r *checkReport, vizDir string) {
	ops := h.porcupineOps()
	res, info := porcupine.CheckOperationsVerbose(leaseModel, ops, 60*time.Second)
	r.linearizable = res
	if res == porcupine.Ok {
		return
	}
	if vizDir != "" {
		r.vizPath = filepath.Join(vizDir, "porcupine.html")
		if err := porcupine.VisualizePath(leaseModel, info, r.vizPath); err != nil {
			r.vizPath = "(visualization failed: " + err.Error() + ")"
		}
	}
	if res == porcupine.Illegal {
		r.add("not linearizable", "porcupine found no linearization of %d operations against the lease model; see %s", len(ops), r.vizPath)
	} else {
		r.add("linearizability unknown", "porcupine timed out on %d operations", len(ops))
	}
}
