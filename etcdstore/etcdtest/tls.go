package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a TLS server started by [StartTLS]: the CA
// that signed the server's and the client's certificates, and the client
// certificate and key that the server requires.
type TLSFiles struct {
	CA, ClientCert, ClientKey string
	serverCert, serverKey     string
}

// StartTLS is [Start] with TLS on the client port, requiring a client
// certificate signed by a fresh CA; the files are in a temporary directory
// of t.
func StartTLS(t testing.TB) (*Server, TLSFiles) {
	t.Helper()
	files := makeTLS(t)
	return start(t, &files), files
}

// makeTLS writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all ECDSA P-256, valid for a day.
func makeTLS(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey, ca := newCert(t, nil, nil, &x509.Certificate{
		Subject: pkix.Name{CommonName: "etcdtest CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign,
	})
	files := TLSFiles{CA: filepath.Join(dir, "ca.pem")}
	writePEM(t, files.CA, "CERTIFICATE", ca.Raw)
	serverKey, server := newCert(t, caKey, ca, &x509.Certificate{
		Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	})
	files.serverCert, files.serverKey = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	writePEM(t, files.serverCert, "CERTIFICATE", server.Raw)
	writeKey(t, files.serverKey, serverKey)
	clientKey, client := newCert(t, caKey, ca, &x509.Certificate{
		Subject: pkix.Name{CommonName: "leasefs"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	})
	files.ClientCert, files.ClientKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	writePEM(t, files.ClientCert, "CERTIFICATE", client.Raw)
	writeKey(t, files.ClientKey, clientKey)
	return files
}

var serial atomic.Int64

// newCert makes a certificate from tmpl, signed by parent (self-signed
// when parent is nil).
func newCert(t testing.TB, parentKey *ecdsa.PrivateKey, parent, tmpl *x509.Certificate) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(serial.Add(1))
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKey(t testing.TB, path string, key *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "EC PRIVATE KEY", der)
}
