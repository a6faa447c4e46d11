package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/cluster"
	"github.com/cubicle-dev/cubicle/internal/metrics"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// clusterFlags are the settings of cluster mode.
type clusterFlags struct {
	etcd       string
	name       string
	advertise  string
	leaseTTL   time.Duration
	candidates int
	// etcd's TLS and auth: a CA file, this node's client certificate
	// and key, a user and a file holding its password.
	etcdCA, etcdCert, etcdKey string
	etcdUser, etcdPassFile    string
}

// etcdSecurity turns the etcd TLS and auth flags into the client's
// settings: TLS when any certificate flag is set (a CA alone checks the
// server; a certificate and key also prove this node), a user with the
// password read from its file.
func etcdSecurity(f clusterFlags) (*tls.Config, string, string, error) {
	var tc *tls.Config
	if f.etcdCA != "" || f.etcdCert != "" || f.etcdKey != "" {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
		if f.etcdCA != "" {
			pem, err := os.ReadFile(f.etcdCA)
			if err != nil {
				return nil, "", "", fmt.Errorf("--etcd-ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, "", "", fmt.Errorf("--etcd-ca: %s holds no PEM certificate", f.etcdCA)
			}
		}
		if (f.etcdCert == "") != (f.etcdKey == "") {
			return nil, "", "", errors.New("--etcd-cert and --etcd-key go together")
		}
		if f.etcdCert != "" {
			cert, err := tls.LoadX509KeyPair(f.etcdCert, f.etcdKey)
			if err != nil {
				return nil, "", "", fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
	}
	if (f.etcdUser == "") != (f.etcdPassFile == "") {
		return nil, "", "", errors.New("--etcd-user and --etcd-password-file go together")
	}
	var pass string
	if f.etcdPassFile != "" {
		b, err := os.ReadFile(f.etcdPassFile)
		if err != nil {
			return nil, "", "", fmt.Errorf("--etcd-password-file: %w", err)
		}
		if pass = strings.TrimRight(string(b), "\r\n"); pass == "" {
			return nil, "", "", fmt.Errorf("--etcd-password-file: %s is empty", f.etcdPassFile)
		}
	}
	return tc, f.etcdUser, pass, nil
}

// clusterNode is this node's part of a cluster: the store of the
// catalog's truth (the manager) seen through cluster.Local.
type clusterNode struct {
	mgr *sandbox.Manager
	// drainFile drains the node while it exists: an operator's switch
	// (touch it before maintenance, remove it after), kept out of the
	// API, where every key is a tenant.
	drainFile string
	// backends are the backends available here, as refreshBackends
	// last found them: asking the drivers can exec probes, which on a
	// loaded host take seconds, and Load runs in the loop that renews
	// the node's lease.
	backends *atomic.Pointer[[]string]
}

// refreshBackends asks the manager which backends are available now.
func (n clusterNode) refreshBackends(ctx context.Context) {
	var names []string
	for _, b := range n.mgr.Backends(ctx) {
		if b.Available {
			names = append(names, b.Name)
		}
	}
	n.backends.Store(&names)
}

// Load is the node's capacity and load, for placement.
func (n clusterNode) Load(ctx context.Context) cluster.Load {
	var l cluster.Load
	if b := n.backends.Load(); b != nil {
		l.Backends = *b
	}
	c := n.mgr.Capacity()
	l.MaxSandboxes, l.Live = c.MaxSandboxes, c.Running
	l.FreeMemoryMB = availableMemoryMB()
	if _, err := os.Stat(n.drainFile); err == nil {
		l.Draining = true
	}
	for _, p := range n.mgr.Pools() {
		if l.Pools == nil {
			l.Pools = map[string]int{}
		}
		l.Pools[p.Pool] = p.Ready
	}
	return l
}

// Sandboxes are the node's sandboxes as catalog entries; stopped and
// failed ones are left out (they are gone for the cluster).
func (n clusterNode) Sandboxes(ctx context.Context) []cluster.Entry {
	owners := n.mgr.Owners()
	var out []cluster.Entry
	for _, sb := range n.mgr.List(ctx, sandbox.Filter{}) {
		if sb.State == sandbox.StateStopped || sb.State == sandbox.StateFailed {
			continue
		}
		e, err := api.CatalogEntry(sb, owners[sb.ID])
		if err != nil {
			continue
		}
		out = append(out, e)
	}
	return out
}

// drainPauses reports whether the drain file asks for the node's
// sandboxes to be paused (its first line is "pause"), not waited for.
func (n clusterNode) drainPauses() bool {
	b, err := os.ReadFile(n.drainFile)
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(first) == "pause"
}

// pauseForDrain pauses, one at a time, the node's running sandboxes
// whose backend can pause, while the drain file says "pause": the node
// is then empty of boxes (a host can be rebooted) and each sandbox waits
// on its disk, to be resumed on this node, through any node, by its
// user. A sandbox that would not pause is not tried again by this call's
// caller (failed keeps it) while this drain lasts.
func (n clusterNode) pauseForDrain(ctx context.Context, failed map[string]bool, log *slog.Logger) {
	if !n.drainPauses() {
		return
	}
	for _, sb := range n.mgr.List(ctx, sandbox.Filter{State: sandbox.StateRunning}) {
		if ctx.Err() != nil || !n.drainPauses() {
			return
		}
		if failed[sb.ID] {
			continue
		}
		if ok, _ := n.mgr.PauseInfo(ctx, sb.Backend); !ok {
			failed[sb.ID] = true
			log.Info("drain: sandbox left running; its backend cannot pause here", "sandbox", sb.ID, "backend", sb.Backend)
			continue
		}
		if _, err := n.mgr.Pause(ctx, sb.ID); err != nil {
			failed[sb.ID] = true
			log.Warn("drain: pause failed; the sandbox runs on", "sandbox", sb.ID, "err", err)
			continue
		}
		log.Info("drain: sandbox paused", "sandbox", sb.ID)
	}
}

// availableMemoryMB reads MemAvailable from /proc/meminfo; 0 when it
// cannot.
func availableMemoryMB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb / 1024
		}
	}
	return 0
}

// advertiseURL is the URL other nodes reach this one at: the flag, or
// the listener's own address when it names one.
func advertiseURL(flagValue string, ln net.Addr) (string, error) {
	if flagValue != "" {
		u, err := url.Parse(flagValue)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return "", fmt.Errorf("want http(s)://host:port, not %q", flagValue)
		}
		return strings.TrimSuffix(flagValue, "/"), nil
	}
	tcp, ok := ln.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		return "", fmt.Errorf("the API listens on every address (%s): say which one the other nodes reach it at", ln)
	}
	return "http://" + tcp.String(), nil
}

// startCluster joins the cluster when --cluster-etcd is set; nil without
// it (a single host).
func startCluster(ctx context.Context, f clusterFlags, ln net.Addr, mgr *sandbox.Manager, dataDir string, m *metrics.Metrics, log *slog.Logger) (*cluster.Cluster, func(), error) {
	if f.etcd == "" {
		return nil, func() {}, nil
	}
	var endpoints []string
	for _, e := range strings.Split(f.etcd, ",") {
		if e = strings.TrimSpace(e); e != "" {
			endpoints = append(endpoints, e)
		}
	}
	adv, err := advertiseURL(f.advertise, ln)
	if err != nil {
		return nil, nil, fmt.Errorf("--advertise-url: %w", err)
	}
	name := f.name
	if name == "" {
		if name, err = os.Hostname(); err != nil {
			return nil, nil, fmt.Errorf("--node-name: %w", err)
		}
	}
	tlsConf, user, pass, err := etcdSecurity(f)
	if err != nil {
		return nil, nil, err
	}
	node := clusterNode{mgr: mgr, drainFile: filepath.Join(dataDir, "drain"), backends: new(atomic.Pointer[[]string])}
	node.refreshBackends(ctx)
	c, err := cluster.New(cluster.Config{
		TLS: tlsConf, Username: user, Password: pass,
		Endpoints: endpoints, Name: name, URL: adv, Version: version,
		LeaseTTL: f.leaseTTL, Candidates: f.candidates,
		Local: node, Log: log,
	})
	if err != nil {
		return nil, nil, err
	}
	// --key-max-sandboxes counts a key's sandboxes on every node: the
	// manager checks it after a create's own checks, so a bad request is
	// told what is wrong with it first.
	mgr.SetElsewhere(c.LiveOf)
	// --key-create-rate is one budget for the cluster, kept in etcd; a
	// node that cannot reach etcd keeps the rate for itself meanwhile.
	mgr.SetSharedRate(c.TakeCreate)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	paused, probed := make(chan struct{}), make(chan struct{})
	go func() {
		// A drain that pauses: every 2 s, as the drain file is read for
		// the node's record. A sandbox that would not pause is tried
		// again at the next drain.
		defer close(paused)
		failed := map[string]bool{}
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			if node.drainPauses() {
				node.pauseForDrain(cctx, failed, log)
			} else {
				clear(failed)
			}
			select {
			case <-cctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() {
		// Which backends are available, for the node's record.
		defer close(probed)
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-t.C:
				node.refreshBackends(cctx)
			}
		}
	}()
	go func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			st := c.Stats()
			m.ClusterNodes.Set(float64(st.Nodes))
			m.ClusterEntries.Set(float64(st.Entries))
			if c.Degraded() != "" {
				m.ClusterDegraded.Set(1)
			} else {
				m.ClusterDegraded.Set(0)
			}
			select {
			case <-cctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	log.Info("cluster: joining", "node", name, "url", adv, "etcd", endpoints)
	stop := func() {
		cancel()
		<-done
		<-paused
		<-probed
		// The lease is left to run: a node back within it (an upgrade)
		// never shows its sandboxes lost.
		_ = c.Close()
	}
	return c, stop, nil
}
