package e2e

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
	"github.com/cubicle-dev/cubicle/internal/needs"
	"github.com/cubicle-dev/cubicle/test/harness"
)

// e2bDomain is the E2B domain of the test: the SDKs build
// https://<port>-<sandbox>.e2b.test hosts from it, which the test reaches at
// the daemon's TLS listener with a wildcard certificate of its own CA.
const e2bDomain = "e2b.test"

// TestE2BSDK runs the JavaScript suite in test/e2b-js: the unmodified e2b
// and @e2b/desktop SDKs (pinned by its package-lock.json) against a real
// cubicled on gvisor (or the backend CUBICLE_E2E_BACKEND names), configured
// only the way E2B's users configure them
// (E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN, E2B_API_KEY). It then checks
// that the suite left no sandbox running and nothing of one on the host.
//
// The JS tests skip, with the reason, what the desktop image cannot do yet
// (CUBICLE_REQUIRE_E2E=1 makes them fail instead); the Go test lists those
// skips at the end.
func TestE2BSDK(t *testing.T) {
	needs.Root(t)
	needs.Image(t, filepath.Join(imageDir(), "desktop"))
	needs.Command(t, "node", "npm")
	nodeForSDK(t)

	jsDir := filepath.Join(harness.RepoRoot(), "test", "e2b-js")
	npmCI(t, jsDir)
	// The SDKs' sandboxes run on the daemon's default backend: gvisor, or
	// what CUBICLE_E2E_BACKEND names (make e2e BACKEND=firecracker).
	for _, backend := range selectedBackends("gvisor") {
		t.Run(backend, func(t *testing.T) {
			needsBackend(t, backend)
			testE2BSDK(t, jsDir, backend)
		})
	}
}

func testE2BSDK(t *testing.T, jsDir, backend string) {

	pki := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, pki, "*."+e2bDomain, e2bDomain)
	tlsAddr := freeAddr(t)
	apiKey := "e2b_" + randomHex(t, 20)

	dataDir, err := os.MkdirTemp("", "cubicle-e2b-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// An E2B-format key is a configured key like any other; the native API
	// accepts it as well.
	d, err := harness.Start(ctx, harness.Options{
		DataDir:        dataDir,
		ImageDir:       imageDir(),
		DefaultBackend: backend,
		APIKey:         apiKey,
		Args: []string{
			"--e2b-domain", e2bDomain,
			"--tls-listen", tlsAddr, "--tls-cert", certFile, "--tls-key", keyFile,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(d.URL, client.WithAPIKey(apiKey), client.WithTimeout(3*time.Minute))
	t.Cleanup(func() {
		if sbs, err := c.List(context.Background(), client.ListOptions{}); err == nil {
			for _, sb := range sbs {
				if sb.State != "stopped" && sb.State != "failed" {
					c.Destroy(context.Background(), sb.ID)
				}
			}
		}
		d.Stop()
		if t.Failed() {
			log, _ := os.ReadFile(d.Log)
			t.Logf("cubicled log (tail):\n%s", tail(string(log), 60))
		}
		os.RemoveAll(dataDir)
	})
	checkTLS(t, tlsAddr, caFile)

	env := []string{
		"E2B_API_URL=" + d.URL,
		"E2B_SANDBOX_URL=" + d.URL,
		"E2B_DOMAIN=" + e2bDomain,
		"E2B_API_KEY=" + apiKey,
		"NODE_EXTRA_CA_CERTS=" + caFile,
		"CUBICLE_TLS_ADDR=" + tlsAddr,
		"CUBICLE_E2E_SUITE_BACKEND=" + backend,
		"NO_COLOR=1",
	}
	// Suite files are run one at a time: each one starts a desktop.
	// CUBICLE_E2B_JS_ARGS narrows a run by hand to files or tests:
	// "--test-name-pattern=watch basic.test.mjs". CUBICLE_E2E_FORKS
	// (forkCount) reaches the suite's fork test with the rest of this
	// process's environment.
	args := []string{"--test", "--test-reporter=spec", "--test-concurrency=1"}
	args = append(args, strings.Fields(os.Getenv("CUBICLE_E2B_JS_ARGS"))...)
	out, err := runLogged(t, 25*time.Minute, jsDir, env, "node", args...)
	if skips := imageGapLines(out); len(skips) > 0 {
		t.Logf("skipped for gaps of the desktop image (CUBICLE_REQUIRE_E2E=1 fails them):\n%s", strings.Join(skips, "\n"))
	}
	if err != nil {
		t.Errorf("node --test: %v", err)
	}

	assertSuiteLeftNothing(t, d, c, "SDK suite")
}

// assertSuiteLeftNothing checks, after a suite in another language drove
// the daemon, that every sandbox it made is stopped and gone from the
// host, and that it made one at all.
func assertSuiteLeftNothing(t *testing.T, d *harness.Daemon, c *client.Client, suite string) {
	t.Helper()
	sbs, err := c.List(context.Background(), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) == 0 {
		t.Error("the daemon lists no sandbox: did the suite create any?")
	}
	for _, sb := range sbs {
		if sb.State != client.StateStopped {
			t.Errorf("sandbox %s left %s by the suite", sb.ID, sb.State)
			continue
		}
		assertNoTrace(t, d, sb.Backend, sb.ID)
	}
	t.Logf("%d sandboxes made and stopped by the %s", len(sbs), suite)
}

// nodeForSDK gates t on a node the pinned SDKs support: their engines
// field says ">=20.18.1 <21 || >=22" (Debian 12's own nodejs is 18).
func nodeForSDK(t *testing.T) {
	t.Helper()
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		needs.Skip(t, "node --version: %v", err)
	}
	have := strings.TrimSpace(string(out))
	var v [3]int
	for i, f := range strings.SplitN(strings.TrimPrefix(have, "v"), ".", 3) {
		v[i], _ = strconv.Atoi(f)
	}
	if !(v[0] >= 22 || v[0] == 20 && (v[1] > 18 || v[1] == 18 && v[2] >= 1)) {
		needs.Skip(t, "the e2b SDKs need node >=20.18.1 <21 || >=22, have %s", have)
	}
}

// npmCI installs the suite's pinned packages when node_modules is missing
// or older than package-lock.json (npm ci would otherwise run every time).
func npmCI(t *testing.T, dir string) {
	t.Helper()
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	// npm writes node_modules/.package-lock.json at the end of an install.
	if inst, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && !inst.ModTime().Before(lock.ModTime()) {
		return
	}
	if _, err := runLogged(t, 10*time.Minute, dir, nil, "npm", "ci", "--no-audit", "--no-fund"); err != nil {
		t.Fatalf("npm ci in %s: %v", dir, err)
	}
}

// runLogged runs a command in dir with the environment plus env (E2B
// variables of the caller's own environment removed, so that only the
// test's reach the SDKs), logs its output line by line as it comes and
// returns it.
//
//depcheck:runner
func runLogged(t *testing.T, timeout time.Duration, dir string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...) //depcheck:caller
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var (
		buf  strings.Builder
		wg   sync.WaitGroup
		prog = filepath.Base(name)
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			t.Logf("%s: %s", prog, sc.Text())
			buf.WriteString(sc.Text() + "\n")
		}
		io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	wg.Wait()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (after %v)", ctx.Err(), timeout)
	}
	return buf.String(), err
}

// imageGapLines are the JS tests skipped for what the desktop image lacks.
func imageGapLines(out string) []string {
	re := regexp.MustCompile(`(?m)^\s*﹣ (.*# desktop image gap.*)$`)
	var lines []string
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		lines = append(lines, "  "+m[1])
	}
	return lines
}

// checkTLS fails t unless the daemon's TLS listener answers E2B's /health
// with the test certificate, so that a broken listener is reported as such
// rather than as SDK failures.
func checkTLS(t *testing.T, addr, caFile string) {
	t.Helper()
	pemCA, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCA)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://api." + e2bDomain + "/health")
	if err != nil {
		t.Fatalf("TLS listener %s: %v", addr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("GET https://api.%s/health via %s: %s, want 204", e2bDomain, addr, resp.Status)
	}
}

// writeTestPKI writes a throwaway CA and a server certificate for names,
// signed by it, into dir and returns the paths of the CA certificate, the
// server certificate and its key (PEM).
func writeTestPKI(t *testing.T, dir string, names ...string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cubicle e2e test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("tls.pem", "CERTIFICATE", leafDER), write("tls.key", "PRIVATE KEY", keyDER)
}

// freeAddr returns a loopback address with a port free right now, the way
// the harness picks the API's.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
