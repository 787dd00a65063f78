package cli

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leasefs/leasefs/etcdstore"
	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/leasecore"
)

func TestStoreFlagParse(t *testing.T) {
	for _, tc := range []struct {
		store     string
		endpoints []string
		prefix    string
		bad       bool
	}{
		{store: "file"},
		{store: "", bad: true},
		{store: "etcd://127.0.0.1:2379/leasefs", endpoints: []string{"127.0.0.1:2379"}, prefix: "/leasefs"},
		{store: "etcd://a:1,b:2/x/y/", endpoints: []string{"a:1", "b:2"}, prefix: "/x/y"},
		{store: "etcd://a:1/", bad: true},
		{store: "etcd://a:1", bad: true},
		{store: "etcd://a/x", bad: true},
		{store: "redis://a:1/x", bad: true},
		{store: "etcd://:2379/x", bad: true},
		{store: "etcd://a:0/x", bad: true},
		{store: "etcd://a:99999/x", bad: true},
		{store: "etcd://a:b/x", bad: true},
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

// The --etcd-* flags reach a cluster that requires TLS with a client
// certificate and password authentication.
func TestStoreFlagTLSAndAuth(t *testing.T) {
	srv, files := etcdtest.StartTLS(t)
	ctx := context.Background()
	sf := storeFlags{store: "etcd://" + srv.Endpoint() + "/tls", cacert: files.CA, cert: files.ClientCert, key: files.ClientKey}
	spec, err := sf.parse()
	if err != nil {
		t.Fatal(err)
	}
	o, err := sf.options()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: spec.endpoints, TLS: o.TLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("enabling etcd authentication: %v", err)
		}
	}
	quiet := slog.New(slog.DiscardHandler)
	// An open that must succeed gets a generous timeout: etcd checks the
	// password with bcrypt, slow in a -race build on a loaded machine (2 s
	// was seen to expire). One that must fail may wait it out: 2 s.
	openWith := func(sf storeFlags, timeout time.Duration) (*etcdstore.Store, error) {
		o, err := sf.options()
		if err != nil {
			return nil, err
		}
		o.Logger, o.CallTimeout = quiet, timeout
		return etcdstore.Open(ctx, spec.endpoints, spec.prefix, o)
	}
	t.Setenv(etcdPasswordEnv, "rootpw")
	sf.user = "root"
	s, err := openWith(sf, 15*time.Second)
	if err != nil {
		t.Fatalf("open with TLS and the password from $%s: %v", etcdPasswordEnv, err)
	}
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1}); err != nil {
		t.Errorf("Reserve over TLS with authentication: %v", err)
	}
	s.Close()
	wrong := sf
	wrong.user = "root:nope"
	if s, err := openWith(wrong, 2*time.Second); err == nil {
		s.Close()
		t.Error("open with a wrong password succeeded")
	}
	noCert := sf
	noCert.cert, noCert.key = "", ""
	if s, err := openWith(noCert, 2*time.Second); err == nil {
		s.Close()
		t.Error("open without the client certificate the server requires succeeded")
	}
}
