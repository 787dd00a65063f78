package client

import (
	"testing"
	"time"
)

func TestParseStatus(t *testing.T) {
	doc := `resource = "ci/deploy"
lease_id = "lease-3q4k"
status = "active"
mode = "token"
generation = 17
holder_uid = 1000
holder_pid = 4242
host = "vm"
started_at = 2026-11-30T09:15:00.412Z
heartbeat_at = 2026-11-30T09:18:00.050Z
expires_at = 2026-11-30T09:23:00.050Z
client = "say \"hi\"\tnow"
waiters = 2
`
	st, err := parseStatus([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if st.Resource != "ci/deploy" || st.LeaseID != "lease-3q4k" || st.State != "active" || st.Mode != "token" ||
		st.Generation != 17 || st.HolderUID != 1000 || st.HolderPID != 4242 || st.Host != "vm" || st.Waiters != 2 {
		t.Errorf("parsed %+v", st)
	}
	if st.Fields["client"] != "say \"hi\"\tnow" {
		t.Errorf("client %q", st.Fields["client"])
	}
	if st.Duration() != 5*time.Minute {
		t.Errorf("Duration %v, want 5m", st.Duration())
	}
	if _, err := parseStatus([]byte("hwl_abc\n")); err != errNoStatus {
		t.Errorf("a token parsed as a status document: %v", err)
	}
	if _, err := parseStatus([]byte("lease_id = \"x\"\ngeneration = -1\n")); err == nil {
		t.Error("a negative generation parsed")
	}
}

func TestCommandPayloads(t *testing.T) {
	l := &Lease{token: "hwl_T"}
	for _, c := range []struct {
		action string
		a      Annotations
		want   string
	}{
		{"renew", nil, "hwl_T\n"},
		{"renew", Annotations{"pid": "12", "client": "a\"b\\c\n\x01"}, "token = \"hwl_T\"\nclient = \"a\\\"b\\\\c\\n\\u0001\"\npid = 12\n"},
		{"complete", nil, "token = \"hwl_T\"\naction = \"complete\"\n"},
		{"abandon", Annotations{"pid": "x"}, "token = \"hwl_T\"\naction = \"abandon\"\npid = \"x\"\n"},
	} {
		if got := string(l.command(c.action, c.a)); got != c.want {
			t.Errorf("command(%s, %v) = %q, want %q", c.action, c.a, got, c.want)
		}
	}
}

func TestDeadlines(t *testing.T) {
	down := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if got := reconnectDeadline(down, time.Minute, 0, time.Time{}); !got.Equal(down.Add(time.Minute)) {
		t.Errorf("file store: %v", got)
	}
	until := down.Add(5 * time.Second)
	if got := reconnectDeadline(down, time.Minute, time.Second, until); !got.Equal(down.Add(4 * time.Second)) {
		t.Errorf("etcd: %v, want keepalive_until minus grace", got)
	}
	if got := reconnectDeadline(down, 0, 0, until); !got.Equal(down) {
		t.Errorf("reconnect 0: %v, want at once", got)
	}
	if got := tokenDeadline(down, time.Minute, down.Add(10*time.Second)); !got.Equal(down.Add(10 * time.Second)) {
		t.Errorf("token: %v, want expires_at", got)
	}
	if got := tokenDeadline(down, time.Second, down.Add(10*time.Second)); !got.Equal(down.Add(time.Second)) {
		t.Errorf("token: %v, want the reconnect bound", got)
	}
}
