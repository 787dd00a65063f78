package fusefs

import (
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/leasefs/leasefs/leasecore"
)

const testToken = "hwl_abcdefghijklmnopqrstuvwxyz234567abcdefg"

func eqAnnotations(a, b leasecore.Annotations) bool { return maps.Equal(a, b) }

func TestParsePayload(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    command
	}{
		{"bare token", testToken, command{action: actionRenew, token: testToken}},
		{"bare token newline", testToken + "\n", command{action: actionRenew, token: testToken}},
		{"bare token CRLF", testToken + "\r\n", command{action: actionRenew, token: testToken}},
		{"bare token surrounding blanks", "  " + testToken + " \t\n", command{action: actionRenew, token: testToken}},
		{"takeover", "takeover", command{action: actionTakeover}},
		{"takeover newline", "takeover\n", command{action: actionTakeover}},
		{"takeover CRLF", "takeover\r\n", command{action: actionTakeover}},
		{"toml token only", `token = "hwl_x"`, command{action: actionRenew, token: "hwl_x"}},
		{"toml renew", "token = \"hwl_x\"\naction = \"renew\"\n", command{action: actionRenew, token: "hwl_x"}},
		{"toml complete", "token = \"hwl_x\"\naction = \"complete\"\n", command{action: actionComplete, token: "hwl_x"}},
		{"toml abandon", "action = \"abandon\"\ntoken = \"hwl_x\"", command{action: actionAbandon, token: "hwl_x"}},
		{"toml CRLF", "token = \"hwl_x\"\r\naction = \"complete\"\r\n", command{action: actionComplete, token: "hwl_x"}},
		{"toml takeover", `action = "takeover"`, command{action: actionTakeover}},
		{"toml pid zero clears", "token = \"hwl_x\"\npid = 0\n", command{action: actionRenew, token: "hwl_x", ann: leasecore.Annotations{"pid": "0"}}},
		{
			"toml takeover reason", "action = \"takeover\"\nreason = \"ci job 7 is stuck\"\n",
			command{action: actionTakeover, reason: "ci job 7 is stuck"},
		},
		{
			"toml annotations",
			"token = \"hwl_x\"\nclient = \"bash\"\nactor_session_id = \"s-1\"\ntask_assignment_id = \"t-2\"\n" +
				"anchor_state = \"dirty\"\nanchor_root = \"/src\"\npath = \"a/b\"\npid = 4242\n",
			command{action: actionRenew, token: "hwl_x", ann: leasecore.Annotations{
				"client":             "bash",
				"actor_session_id":   "s-1",
				"task_assignment_id": "t-2",
				"anchor_state":       "dirty",
				"anchor_root":        "/src",
				"path":               "a/b",
				"pid":                "4242",
			}},
		},
		{
			"toml empty annotation clears", "token = \"hwl_x\"\nclient = \"\"\n",
			command{action: actionRenew, token: "hwl_x", ann: leasecore.Annotations{"client": ""}},
		},
		{"toml pid max", "token = \"hwl_x\"\npid = 4194304\n", command{action: actionRenew, token: "hwl_x", ann: leasecore.Annotations{"pid": "4194304"}}},
		{"toml comment", "# renew\ntoken = \"hwl_x\" # the token\n", command{action: actionRenew, token: "hwl_x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePayload([]byte(tt.payload))
			if err != nil {
				t.Fatalf("parsePayload(%q): %v", tt.payload, err)
			}
			if got.action != tt.want.action || got.token != tt.want.token || got.reason != tt.want.reason {
				t.Errorf("parsePayload(%q) = {action %q token %q reason %q}, want {action %q token %q reason %q}",
					tt.payload, got.action, got.token, got.reason, tt.want.action, tt.want.token, tt.want.reason)
			}
			if !eqAnnotations(got.ann, tt.want.ann) {
				t.Errorf("parsePayload(%q) annotations = %+v, want %+v", tt.payload, got.ann, tt.want.ann)
			}
		})
	}
}

func TestParsePayloadErrors(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		// inMsg, when set, must appear in the error message.
		inMsg string
	}{
		{"empty", "", "empty"},
		{"newline only", "\n", "empty"},
		{"whitespace only", " \t\r\n ", "empty"},
		{"invalid UTF-8", "\xff\xfe" + testToken, "UTF-8"},
		{"invalid UTF-8 in TOML string", "token = \"hwl_\xc3\x28\"", "UTF-8"},
		{"not a token", "not a token", ""},
		{"two tokens", testToken + "\n" + testToken, ""},
		{"unknown key", "token = \"hwl_x\"\ncolour = \"red\"\n", "unknown key"},
		{"unknown table", "token = \"hwl_x\"\n[extra]\nk = 1\n", "not key = value"},
		{"unknown action", "token = \"hwl_x\"\naction = \"steal\"\n", "unknown action"},
		{"unknown bare word", "renew", ""},
		{"missing token for renew", "action = \"renew\"\n", "needs a token"},
		{"missing token default action", "client = \"bash\"\n", "needs a token"},
		{"empty token", "token = \"\"\n", "needs a token"},
		{"missing token for complete", "action = \"complete\"\n", "needs a token"},
		{"missing token for abandon", "action = \"abandon\"\n", "needs a token"},
		{"comment only", "# nothing\n", "needs a token"},
		{"reason with renew", "token = \"hwl_x\"\nreason = \"why not\"\n", "reason"},
		{"reason with complete", "token = \"hwl_x\"\naction = \"complete\"\nreason = \"done\"\n", "reason"},
		{"pid negative", "token = \"hwl_x\"\npid = -1\n", "pid"},
		{"pid huge", "token = \"hwl_x\"\npid = 4194305\n", "pid"},
		{"pid int64 max", "token = \"hwl_x\"\npid = 9223372036854775807\n", "pid"},
		{"pid overflow", "token = \"hwl_x\"\npid = 99999999999999999999\n", "out of range"},
		{"pid string", "token = \"hwl_x\"\npid = \"42\"\n", ""},
		{"pid float", "token = \"hwl_x\"\npid = 4.2\n", ""},
		{"token not a string", "token = 5\n", ""},
		{"action not a string", "token = \"hwl_x\"\naction = true\n", ""},
		{"duplicate key", "token = \"hwl_x\"\ntoken = \"hwl_y\"\n", "line 2: \"Key 'token' has already been defined.\""},
		{"bare TOML key", "token\n", ""},
		{"NUL byte", "\x00", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePayload([]byte(tt.payload))
			if err == nil {
				t.Fatalf("parsePayload(%q) = %+v, want an error", tt.payload, got)
			}
			if !errors.Is(err, errBadPayload) {
				t.Errorf("parsePayload(%q) error %v does not wrap errBadPayload", tt.payload, err)
			}
			if tt.inMsg != "" && !strings.Contains(err.Error(), tt.inMsg) {
				t.Errorf("parsePayload(%q) error %q does not mention %q", tt.payload, err, tt.inMsg)
			}
		})
	}
}

// TestParsePayloadErrorHidesToken checks that a refused payload's error,
// which is logged, never repeats the token it carried (docs/PROTOCOL.md §4.3: the
// plaintext token is never written to logs or errors).
func TestParsePayloadErrorHidesToken(t *testing.T) {
	for _, p := range []string{
		"token = \"" + testToken + "\"\nreason = \"r\"\n",
		"token = \"" + testToken + "\"\naction = \"steal\"\n",
		"token = \"" + testToken + "\"\ncolour = 1\n",
		"token = \"" + testToken + "\"\npid = -4\n",
		testToken + " trailing",
		// TOML syntax errors, whose messages may quote the input.
		"token = " + testToken + "\n",
		"token = \"" + testToken + "\" " + testToken + "\n",
		"token = \"" + testToken + "\"\ntoken = \"" + testToken + "\"\n",
		"token = '" + testToken + "\n",
		"pid = " + testToken[4:] + "\n",
	} {
		_, err := parsePayload([]byte(p))
		if err == nil {
			t.Fatalf("parsePayload(%q) succeeded", p)
		}
		// Not even a part of it: any 8 characters of its random part.
		for k := len(leasecore.TokenPrefix); k+8 <= len(testToken); k++ {
			if strings.Contains(err.Error(), testToken[k:k+8]) {
				t.Errorf("error for %q reveals (part of) the token: %v", p, err)
				break
			}
		}
	}
}

func FuzzParsePayload(f *testing.F) {
	for _, seed := range []string{
		"",
		"\n",
		" \t\r\n",
		testToken,
		testToken + "\n",
		testToken + "\r\n",
		"takeover",
		"takeover\n",
		"not a token",
		"hwl_",
		"hwl_\"",
		`token = "hwl_x"`,
		"token = \"hwl_x\"\naction = \"complete\"\n",
		"token = \"hwl_x\"\naction = \"abandon\"\n",
		"action = \"takeover\"\nreason = \"stuck\"\n",
		"token = \"hwl_x\"\nclient = \"c\"\nactor_session_id = \"s\"\npid = 42\n",
		"token = \"hwl_x\"\npid = 0\n",
		"token = \"hwl_x\"\npid = -1\n",
		"token = \"hwl_x\"\npid = 99999999999\n",
		"token = \"hwl_x\"\ncolour = \"red\"\n",
		"token = [1, [2, [3]]]\n",
		"[a.b.c]\nd = {e = [1]}\n",
		"token = '''\nhwl_x\n'''\n",
		"\xff\xfe",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		cmd, err := parsePayload(p)
		if err != nil {
			if !errors.Is(err, errBadPayload) {
				t.Fatalf("parsePayload(%q): error %v does not wrap errBadPayload", p, err)
			}
			if cmd.action != "" || cmd.token != "" || cmd.reason != "" || cmd.ann != nil {
				t.Fatalf("parsePayload(%q): error %v with a non-zero command %+v", p, err, cmd)
			}
			return
		}
		if !utf8.Valid(p) {
			t.Fatalf("parsePayload(%q) accepted invalid UTF-8", p)
		}
		switch cmd.action {
		case actionRenew, actionComplete, actionAbandon:
			if cmd.token == "" {
				t.Fatalf("parsePayload(%q): action %q without a token", p, cmd.action)
			}
			if cmd.reason != "" {
				t.Fatalf("parsePayload(%q): reason on action %q", p, cmd.action)
			}
		case actionTakeover:
		default:
			t.Fatalf("parsePayload(%q): unknown action %q accepted", p, cmd.action)
		}
		if v, ok := cmd.ann["pid"]; ok {
			if pid, err := strconv.Atoi(v); err != nil || pid < 0 || pid > 1<<22 {
				t.Fatalf("parsePayload(%q): pid %q out of range accepted", p, v)
			}
		}
		for key := range cmd.ann {
			if !leasecore.IsAnnotationKey(key) {
				t.Fatalf("parsePayload(%q): key %q accepted as an annotation", p, key)
			}
		}
	})
}
