package fusefs

import (
	"errors"
	"strings"
	"testing"
)

// TestParsePayloadRefusesBombsUpFront checks that payloads whose TOML parse
// would cost more than linear time or memory (dotted-key chains, tables,
// arrays, multi-line strings) are refused before parsing: a 64 KiB chain of
// dotted keys made the parser allocate gigabytes and killed the daemon.
func TestParsePayloadRefusesBombsUpFront(t *testing.T) {
	for name, p := range map[string]string{
		"dotted chain":      strings.Repeat("a.", MaxPayload/2-4) + "b=1\n",
		"tables":            strings.Repeat("[a]\n", 1000),
		"array of tables":   strings.Repeat("[[a]]\n", 1000),
		"inline table":      "token = {a = 1}\n",
		"array":             "token = [" + strings.Repeat("1,", 1000) + "1]\n",
		"multi-line string": "token = \"\"\"\nhwl_x\n\"\"\"\n",
		"quoted key":        "\"token\" = \"hwl_x\"\n",
		"takeover+token":    "action = \"takeover\"\ntoken = \"hwl_x\"\n",
	} {
		if _, err := parsePayload([]byte(p)); !errors.Is(err, errBadPayload) {
			t.Errorf("%s: parsePayload = %v, want errBadPayload", name, err)
		}
	}
}
