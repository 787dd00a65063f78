package fusefs

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/BurntSushi/toml"

	"github.com/leasefs/leasefs/leasecore"
)

// MaxPayload is the largest write payload accepted, in bytes (SPEC §3);
// larger writes fail with EFBIG.
const MaxPayload = 64 << 10

// Actions of a write payload (SPEC §4.2).
const (
	actionRenew    = "renew"
	actionComplete = "complete"
	actionAbandon  = "abandon"
	actionTakeover = "takeover"
)

// command is one parsed write payload.
type command struct {
	action string
	token  string
	ann    leasecore.Annotations
	reason string // takeover only
}

// tomlCommand is the TOML form of a write payload (SPEC §4.2).
type tomlCommand struct {
	Token            *string `toml:"token"`
	Action           *string `toml:"action"`
	Reason           *string `toml:"reason"`
	ActorSessionID   *string `toml:"actor_session_id"`
	TaskAssignmentID *string `toml:"task_assignment_id"`
	AnchorState      *string `toml:"anchor_state"`
	AnchorRoot       *string `toml:"anchor_root"`
	Path             *string `toml:"path"`
	Client           *string `toml:"client"`
	PID              *int64  `toml:"pid"`
}

var errBadPayload = errors.New("fusefs: malformed payload")

// commandKeys are the keys a TOML command may use (SPEC §4.2).
var commandKeys = map[string]bool{
	"token": true, "action": true, "reason": true, "actor_session_id": true,
	"task_assignment_id": true, "anchor_state": true, "anchor_root": true,
	"path": true, "client": true, "pid": true,
}

// checkCommandShape accepts only what a command can be before it reaches
// the TOML parser: blank lines, comments, and "key = value" lines whose key
// is a known bare key and whose value is a one-line string or an integer.
// Tables, dotted keys, arrays and multi-line strings are refused up front,
// so the parser's work stays linear in the payload: a payload of dotted
// keys (a.a.a…) costs it time and memory quadratic in their number.
func checkCommandShape(text string) error {
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		switch {
		case !ok:
			return fmt.Errorf("%w: a line is not key = value", errBadPayload)
		case !commandKeys[key]:
			return fmt.Errorf("%w: unknown key %.40q", errBadPayload, key)
		case strings.HasPrefix(value, `"""`) || strings.HasPrefix(value, "'''") || strings.HasPrefix(value, "[") || strings.HasPrefix(value, "{"):
			return fmt.Errorf("%w: key %s: only one-line strings and integers", errBadPayload, key)
		}
	}
	return nil
}

// parsePayload parses one write() payload: a bare token line (renew), the
// bare word "takeover", or a TOML command document (SPEC §4.2). A trailing
// newline is optional. Errors wrap errBadPayload (EINVAL); the payload size
// is checked by the caller. It never panics on any input.
func parsePayload(p []byte) (command, error) {
	if !utf8.Valid(p) {
		return command{}, fmt.Errorf("%w: not valid UTF-8", errBadPayload)
	}
	text := string(p)
	bare := strings.TrimSpace(text)
	switch {
	case bare == "":
		return command{}, fmt.Errorf("%w: empty", errBadPayload)
	case bare == actionTakeover:
		return command{action: actionTakeover}, nil
	case strings.HasPrefix(bare, leasecore.TokenPrefix) && !strings.ContainsAny(bare, " \t\r\n=\"'"):
		return command{action: actionRenew, token: bare}, nil
	}
	if err := checkCommandShape(text); err != nil {
		return command{}, err
	}
	var tc tomlCommand
	md, err := toml.Decode(text, &tc)
	if err != nil {
		return command{}, fmt.Errorf("%w: neither a token nor a TOML command", errBadPayload)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return command{}, fmt.Errorf("%w: unknown key %q", errBadPayload, und[0].String())
	}
	cmd := command{action: actionRenew}
	if tc.Action != nil {
		cmd.action = *tc.Action
	}
	switch cmd.action {
	case actionRenew, actionComplete, actionAbandon:
		if tc.Token == nil || *tc.Token == "" {
			return command{}, fmt.Errorf("%w: action %q needs a token", errBadPayload, cmd.action)
		}
		if tc.Reason != nil {
			return command{}, fmt.Errorf("%w: reason is only for takeover", errBadPayload)
		}
	case actionTakeover:
		if tc.Reason != nil {
			cmd.reason = *tc.Reason
		}
		if tc.Token != nil || tc.ActorSessionID != nil || tc.TaskAssignmentID != nil || tc.AnchorState != nil ||
			tc.AnchorRoot != nil || tc.Path != nil || tc.Client != nil || tc.PID != nil {
			return command{}, fmt.Errorf("%w: takeover takes only a reason", errBadPayload)
		}
	default:
		return command{}, fmt.Errorf("%w: unknown action %q", errBadPayload, cmd.action)
	}
	if tc.Token != nil {
		cmd.token = *tc.Token
	}
	cmd.ann = leasecore.Annotations{
		ActorSessionID:   tc.ActorSessionID,
		TaskAssignmentID: tc.TaskAssignmentID,
		AnchorState:      tc.AnchorState,
		AnchorRoot:       tc.AnchorRoot,
		Path:             tc.Path,
		Client:           tc.Client,
	}
	if tc.PID != nil {
		// pid = 0 clears a recorded pid.
		if *tc.PID < 0 || *tc.PID > 1<<22 {
			return command{}, fmt.Errorf("%w: pid %d out of range", errBadPayload, *tc.PID)
		}
		pid := int(*tc.PID)
		cmd.ann.PID = &pid
	}
	return cmd, nil
}
