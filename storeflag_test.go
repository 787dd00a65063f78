package main

import (
	"errors"
	"slices"
	"testing"
)

func TestStoreFlagParse(t *testing.T) {
	for _, tc := range []struct {
		store     string
		endpoints []string
		prefix    string
		bad       bool
	}{
		{store: "file"},
		{store: ""},
		{store: "etcd://127.0.0.1:2379/leasefs", endpoints: []string{"127.0.0.1:2379"}, prefix: "/leasefs"},
		{store: "etcd://a:1,b:2/x/y/", endpoints: []string{"a:1", "b:2"}, prefix: "/x/y"},
		{store: "etcd://a:1/", bad: true},
		{store: "etcd://a:1", bad: true},
		{store: "etcd://a/x", bad: true},
		{store: "redis://a:1/x", bad: true},
	} {
		sf := storeFlags{store: tc.store}
		spec, err := sf.parse()
		var ue usageError
		switch {
		case tc.bad:
			if !errors.As(err, &ue) {
				t.Errorf("--store %q: %v, want a usage error", tc.store, err)
			}
		case err != nil:
			t.Errorf("--store %q: %v", tc.store, err)
		case tc.endpoints == nil && spec != nil:
			t.Errorf("--store %q = %+v, want the file store", tc.store, spec)
		case tc.endpoints != nil && (spec == nil || !slices.Equal(spec.endpoints, tc.endpoints) || spec.prefix != tc.prefix):
			t.Errorf("--store %q = %+v, want %v %s", tc.store, spec, tc.endpoints, tc.prefix)
		}
	}
	if _, err := (&storeFlags{store: "file", user: "u"}).parse(); err == nil {
		t.Error("--etcd-user with the file store was accepted")
	}
	t.Setenv(etcdPasswordEnv, "secret")
	for user, want := range map[string][2]string{"alice": {"alice", "secret"}, "bob:pw:x": {"bob", "pw:x"}} {
		o, err := (&storeFlags{store: "etcd://a:1/p", user: user}).options()
		if err != nil || o.Username != want[0] || o.Password != want[1] {
			t.Errorf("--etcd-user %q = %q/%q, %v; want %q/%q", user, o.Username, o.Password, err, want[0], want[1])
		}
	}
}
