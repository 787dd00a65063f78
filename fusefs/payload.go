package fusefs

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/BurntSushi/toml"

	"github.com/leasefs/leasefs/leasecore"
)

// MaxPayload is the largest write payload accepted, in bytes (docs/PROTOCOL.md §3);
// larger writes fail with EFBIG.
const MaxPayload = 64 << 10

// Actions of a write payload (docs/PROTOCOL.md §4.2).
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

var errBadPayload = errors.New("fusefs: malformed payload")

// commandKey reports whether key may appear in a TOML command: token,
// action, reason, or an annotation of the lease field table
// (docs/PROTOCOL.md §4.2).
func commandKey(key string) bool {
	return key == "token" || key == "action" || key == "reason" || leasecore.IsAnnotationKey(key)
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
		case !commandKey(key):
			return fmt.Errorf("%w: unknown key %.40q", errBadPayload, key)
		case strings.HasPrefix(value, `"""`) || strings.HasPrefix(value, "'''") || strings.HasPrefix(value, "[") || strings.HasPrefix(value, "{"):
			return fmt.Errorf("%w: key %s: only one-line strings and integers", errBadPayload, key)
		}
	}
	return nil
}

// payloadLike reports whether p, which [parsePayload] refused, was meant
// as a payload: a token (it starts with the token prefix) or a command (a
// line "key = …" with a command key). Such a write is a malformed payload
// (EINVAL) even through an open file that holds a handle lease, whose other
// text is the holder's note (docs/PROTOCOL.md §4.2, "Notes").
func payloadLike(p []byte) bool {
	text := string(p)
	if strings.HasPrefix(strings.TrimSpace(text), leasecore.TokenPrefix) {
		return true
	}
	for line := range strings.SplitSeq(text, "\n") {
		if key, _, ok := strings.Cut(line, "="); ok && commandKey(strings.TrimSpace(key)) {
			return true
		}
	}
	return false
}

// mentionsToken reports whether msg, an error message about payload,
// repeats six or more consecutive characters of a word of payload that
// could be a token or part of one: a word with the token prefix, or one of
// 16 or more letters and digits with a letter in it (a token's random
// part). The plaintext token is never logged (docs/PROTOCOL.md §4.3).
func mentionsToken(msg, payload string) bool {
	isWord := func(r rune) bool {
		return r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
	}
	for _, word := range strings.FieldsFunc(payload, func(r rune) bool { return !isWord(r) }) {
		secret := strings.Contains(word, leasecore.TokenPrefix) ||
			len(word) >= 16 && strings.ContainsFunc(word, func(r rune) bool { return r < '0' || r > '9' })
		if !secret {
			continue
		}
		for k := 0; k+6 <= len(word); k++ {
			if strings.Contains(msg, word[k:k+6]) {
				return true
			}
		}
	}
	return false
}

// parsePayload parses one write() payload: a bare token line (renew), the
// bare word "takeover", or a TOML command document (docs/PROTOCOL.md §4.2). A trailing
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
	doc := make(map[string]any)
	if _, err := toml.Decode(text, &doc); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) && !mentionsToken(pe.Message, text) {
			return command{}, fmt.Errorf("%w: neither a token nor a TOML command (line %d: %.80q)",
				errBadPayload, pe.Position.Line, pe.Message)
		}
		return command{}, fmt.Errorf("%w: neither a token nor a TOML command", errBadPayload)
	}
	cmd := command{action: actionRenew}
	for key, v := range doc {
		switch key {
		case "token", "action", "reason":
			s, ok := v.(string)
			if !ok {
				return command{}, fmt.Errorf("%w: %s must be a string", errBadPayload, key)
			}
			switch key {
			case "token":
				cmd.token = s
			case "action":
				cmd.action = s
			default:
				cmd.reason = s
			}
			continue
		}
		if cmd.ann == nil {
			cmd.ann = make(leasecore.Annotations)
		}
		switch v := v.(type) {
		case string:
			if leasecore.IsIntegerAnnotation(key) {
				return command{}, fmt.Errorf("%w: %s must be an integer", errBadPayload, key)
			}
			cmd.ann[key] = v
		case int64:
			if !leasecore.IsIntegerAnnotation(key) {
				return command{}, fmt.Errorf("%w: %s must be a string", errBadPayload, key)
			}
			// pid = 0 clears a recorded pid.
			if v < 0 || v > 1<<22 {
				return command{}, fmt.Errorf("%w: %s %d out of range", errBadPayload, key, v)
			}
			cmd.ann[key] = strconv.FormatInt(v, 10)
		default:
			return command{}, fmt.Errorf("%w: %s has a value of the wrong type", errBadPayload, key)
		}
	}
	_, hasToken := doc["token"]
	_, hasReason := doc["reason"]
	switch cmd.action {
	case actionRenew, actionComplete, actionAbandon:
		if cmd.token == "" {
			return command{}, fmt.Errorf("%w: action %q needs a token", errBadPayload, cmd.action)
		}
		if hasReason {
			return command{}, fmt.Errorf("%w: reason is only for takeover", errBadPayload)
		}
	case actionTakeover:
		if hasToken || len(cmd.ann) > 0 {
			return command{}, fmt.Errorf("%w: takeover takes only a reason", errBadPayload)
		}
	default:
		return command{}, fmt.Errorf("%w: unknown action %.40q", errBadPayload, cmd.action)
	}
	return cmd, nil
}
