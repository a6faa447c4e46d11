// Package etcdtest runs a real etcd cluster (Debian's etcd-server, the
// /usr/bin/etcd that scripts/deps.sh installs) for tests: N members on
// loopback ports, each with its own data directory, that a test can stop,
// kill and start again to take quorum away and give it back.
package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Member is one etcd server.
type Member struct {
	Name       string
	ClientURL  string
	peerURL    string
	dataDir    string
	logPath    string
	cmd        *exec.Cmd
	exited     chan struct{}
	initialArg string
	transport  http.RoundTripper // nil: plain HTTP
}

// Cluster is a running etcd cluster.
type Cluster struct {
	t       testing.TB
	Members []*Member
	// With StartTLS: the CA that signed the members' certificates, and a
	// client certificate and key it signed too (PEM files).
	CAFile, ClientCert, ClientKey string
	serverCert, serverKey         string
}

// Start starts an n-member cluster and waits until it answers; the
// members are stopped when the test ends. Without etcd it skips (or
// fails under CUBICLE_REQUIRE_E2E).
func Start(t testing.TB, n int) *Cluster { return StartOn(t, n, "127.0.0.1") }

// StartTLS is Start with the members' client endpoints on https, and
// etcd asking every client for a certificate its CA signed
// (--client-cert-auth): Cluster's CAFile, ClientCert and ClientKey are
// what a client needs.
func StartTLS(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, "127.0.0.1", true)
}

// StartOn is Start with the members listening on host (an address of
// the test's own network namespace that other namespaces reach).
func StartOn(t testing.TB, n int, host string) *Cluster {
	t.Helper()
	return start(t, n, host, false)
}

func start(t testing.TB, n int, host string, secure bool) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		if os.Getenv("CUBICLE_REQUIRE_E2E") != "" {
			t.Fatalf("etcd is not installed (scripts/deps.sh installs etcd-server): %v", err)
		}
		t.Skipf("etcd is not installed (scripts/deps.sh installs etcd-server): %v", err)
	}
	c := &Cluster{t: t}
	dir := t.TempDir()
	scheme := "http://"
	if secure {
		scheme = "https://"
		c.writePKI(dir, host)
	}
	var initial []string
	for i := range n {
		m := &Member{
			Name:      fmt.Sprintf("etcd%d", i),
			ClientURL: scheme + freeAddr(t, host),
			peerURL:   "http://" + freeAddr(t, host),
			dataDir:   filepath.Join(dir, fmt.Sprintf("etcd%d", i)),
			logPath:   filepath.Join(dir, fmt.Sprintf("etcd%d.log", i)),
		}
		if secure {
			m.transport = &http.Transport{TLSClientConfig: c.ClientTLS()}
		}
		initial = append(initial, m.Name+"="+m.peerURL)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.initialArg = strings.Join(initial, ",")
		c.start(m)
	}
	t.Cleanup(func() {
		for _, m := range c.Members {
			c.stop(m, syscall.SIGKILL)
		}
	})
	for _, m := range c.Members {
		c.waitHealthy(m)
	}
	return c
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

func (c *Cluster) start(m *Member) {
	c.t.Helper()
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	args := []string{
		"--name", m.Name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", m.ClientURL,
		"--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", m.initialArg,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "cubicle-test",
		// Loopback: elections in a fraction of the default's time.
		"--heartbeat-interval", "50", "--election-timeout", "500",
	}
	if c.CAFile != "" {
		args = append(args, "--cert-file", c.serverCert, "--key-file", c.serverKey,
			"--trusted-ca-file", c.CAFile, "--client-cert-auth")
	}
	cmd := exec.Command("etcd", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start etcd %s: %v", m.Name, err)
	}
	m.cmd = cmd
	m.exited = make(chan struct{})
	go func(ch chan struct{}) { _ = cmd.Wait(); close(ch) }(m.exited)
}

func (c *Cluster) stop(m *Member, sig syscall.Signal) {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(sig)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	m.cmd = nil
}

// Stop stops member i (SIGTERM) and waits for it to exit.
func (c *Cluster) Stop(i int) { c.stop(c.Members[i], syscall.SIGTERM) }

// Restart starts a stopped member i again on its data and waits until it
// answers (which, without a quorum, it cannot: then use StartNoWait).
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.StartNoWait(i)
	c.waitHealthy(c.Members[i])
}

// StartNoWait starts a stopped member i again on its data.
func (c *Cluster) StartNoWait(i int) {
	c.t.Helper()
	if c.Members[i].cmd == nil {
		c.start(c.Members[i])
	}
}

// Healthy reports whether member m answers /health with a leader.
func (m *Member) Healthy() bool {
	cl := http.Client{Timeout: time.Second, Transport: m.transport}
	resp, err := cl.Get(m.ClientURL + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var buf [256]byte
	n, _ := resp.Body.Read(buf[:])
	return resp.StatusCode == http.StatusOK && strings.Contains(string(buf[:n]), `"true"`)
}

func (c *Cluster) waitHealthy(m *Member) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !m.Healthy() {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(m.logPath)
			if len(log) > 4000 {
				log = log[len(log)-4000:]
			}
			c.t.Fatalf("etcd %s not healthy after 30 s; its log:\n%s", m.Name, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeAddr returns an address of host with a port free a moment ago.
func freeAddr(t testing.TB, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// writePKI makes a CA, a server certificate for host signed by it (the
// members share it) and a client certificate, as PEM files in dir.
func (c *Cluster) writePKI(dir, host string) {
	c.t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		c.t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdtest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		c.t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, kind string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			c.t.Fatal(err)
		}
		return p
	}
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			c.t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP(host)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			c.t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			c.t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+".key", "PRIVATE KEY", keyDER)
	}
	c.CAFile = write("ca.pem", "CERTIFICATE", caDER)
	c.serverCert, c.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth)
	c.ClientCert, c.ClientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth)
}

// ClientTLS is a client's TLS settings for a StartTLS cluster: its CA,
// and the client certificate.
func (c *Cluster) ClientTLS() *tls.Config {
	c.t.Helper()
	pemCA, err := os.ReadFile(c.CAFile)
	if err != nil {
		c.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemCA)
	cert, err := tls.LoadX509KeyPair(c.ClientCert, c.ClientKey)
	if err != nil {
		c.t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}
