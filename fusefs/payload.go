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
