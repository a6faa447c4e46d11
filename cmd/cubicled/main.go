// Command cubicled is the cubicle host daemon: the REST API, the sandbox
// manager and reaper, and metrics. It holds flag parsing and wiring only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/apikey"
	"github.com/cubicle-dev/cubicle/internal/cluster"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/driver"
	"github.com/cubicle-dev/cubicle/internal/driver/firecracker"
	"github.com/cubicle-dev/cubicle/internal/driver/oci"
	"github.com/cubicle-dev/cubicle/internal/driver/qemu"
	"github.com/cubicle-dev/cubicle/internal/e2b"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/inflight"
	"github.com/cubicle-dev/cubicle/internal/mcp"
	"github.com/cubicle-dev/cubicle/internal/metrics"
	"github.com/cubicle-dev/cubicle/internal/netpool"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/viewtoken"
	"github.com/cubicle-dev/cubicle/internal/web"
)

// The manager is what the API drives.
var _ api.Manager = (*sandbox.Manager)(nil)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cubicled:", err)
		os.Exit(1)
	}
}

// envOr returns the environment variable's value or def. Only for the
// settings that have no flag; flags read their variables in parseConfig.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func run() error {
	exe, _ := os.Executable()
	fs := flag.CommandLine
	var (
		level   = slog.LevelInfo
		netCIDR = netip.MustParsePrefix(netpool.DefaultCIDR)
		netDNS  []netip.Addr
	)
	var (
		listen         = fs.String("listen", "127.0.0.1:7171", "address to serve the API on (CUBICLE_LISTEN)")
		dataDir        = fs.String("data-dir", "/var/lib/cubicle", "store and per-sandbox state (CUBICLE_DATA_DIR)")
		imageDir       = fs.String("image-dir", "/var/lib/cubicle/images", "built images (CUBICLE_IMAGE_DIR)")
		defaultBackend = fs.String("default-backend", "auto", "auto, firecracker, qemu, gvisor or runc (CUBICLE_DEFAULT_BACKEND)")
		maxSandboxes   = fs.Int("max-sandboxes", 16, "maximum live sandboxes (CUBICLE_MAX_SANDBOXES)")
		defTemplate    = fs.String("default-template", "desktop", "image of a create that names no template: desktop (XFCE) or desktop-lite (openbox, lighter) or any installed image (CUBICLE_DEFAULT_TEMPLATE)")
		keyMax         = fs.Int("key-max-sandboxes", 0, "maximum live sandboxes of one API key, native and E2B APIs together; 0 = only --max-sandboxes (CUBICLE_KEY_MAX_SANDBOXES)")
		keyVolumes     = fs.Int("key-max-volumes", sandbox.DefaultMaxVolumesPerOwner, "volumes one API key may have (CUBICLE_KEY_MAX_VOLUMES)")
		keySnapshots   = fs.Int("key-max-snapshots", sandbox.DefaultMaxSnapshotsPerOwner, "snapshots one API key may keep (CUBICLE_KEY_MAX_SNAPSHOTS)")
		recRetention   = fs.Duration("recording-retention", sandbox.DefaultRecordingRetention, "how long a stopped screen recording's file is kept, however long its sandbox lives (CUBICLE_RECORDING_RETENTION)")
		keyRecordings  = fs.Int("key-max-recordings", sandbox.DefaultMaxRecordingsPerOwner, "screen recordings one API key may keep (CUBICLE_KEY_MAX_RECORDINGS)")
		recMax         = fs.Duration("recording-max-duration", sandbox.DefaultMaxRecordingDuration, "a screen recording stops by itself after this long (CUBICLE_RECORDING_MAX_DURATION)")
		runscBin       = fs.String("runsc", oci.DefaultRunscPath, "the runsc (gVisor) of the gvisor backend, at least of "+oci.MinRunscDate+"; scripts/runsc.sh installs the pinned one at the default (CUBICLE_RUNSC)")
		ffmpegBin      = fs.String("ffmpeg", "ffmpeg", "the ffmpeg program that encodes screen recordings (CUBICLE_FFMPEG)")
		maxVolumeMB    = fs.Int("max-volume-mb", sandbox.DefaultMaxVolumeMB, "largest volume, in MiB; a volume's file is sparse and takes host disk only as sandboxes write (CUBICLE_MAX_VOLUME_MB)")
		keyRate        = fs.Float64("key-create-rate", 0, "sandbox creates per second one API key may make (bursts of up to twice that, at least 1); 0 = no per-key limit (CUBICLE_KEY_CREATE_RATE)")
		maxInFlight    = fs.Int("sandbox-max-requests", api.DefaultMaxInFlight, "requests to one sandbox in progress at once (screenshots, actions, commands, file transfers, live views, E2B data plane); 429 beyond; 0 = no bound (CUBICLE_SANDBOX_MAX_REQUESTS)")
		diskMB         = fs.Int("disk-mb", 4096, "what one gvisor or runc sandbox may write to its root filesystem, in MiB: its writable layer is a sparse ext4 file of this size; 0 = unbounded (CUBICLE_DISK_MB)")
		idleTimeout    = fs.Duration("idle-timeout", 30*time.Minute, "reap sandboxes unused this long (CUBICLE_IDLE_TIMEOUT)")
		maxLifetime    = fs.Duration("max-lifetime", 60*time.Minute, "maximum sandbox lifetime, 0 = unlimited (CUBICLE_MAX_LIFETIME)")
		pausedLifetime = fs.Duration("paused-lifetime", sandbox.DefaultPausedLifetime, "how long a paused sandbox is kept before it is destroyed, 0 = unlimited (CUBICLE_PAUSED_LIFETIME)")
		agentBin       = fs.String("agent-bin", filepath.Join(filepath.Dir(exe), "cubicle-agent"), "static cubicle-agent binary put into every sandbox (CUBICLE_AGENT_BIN)")
		readyTimeout   = fs.Duration("ready-timeout", 3*time.Minute, "how long a create may take to a ready desktop (CUBICLE_READY_TIMEOUT)")
		usageInterval  = fs.Duration("metrics-interval", sandbox.DefaultUsageInterval, "how often each running sandbox's CPU, memory, disk and network figures are sampled, at least 1s (CUBICLE_METRICS_INTERVAL)")
		usageWindow    = fs.Duration("metrics-window", sandbox.DefaultUsageWindow, "how much history of those figures is kept per sandbox, at most 10000 samples (CUBICLE_METRICS_WINDOW)")
		netEnable      = fs.Bool("net", false, "give each sandbox a network: a netns/TAP on a cubicle bridge, an address, nftables egress policy; changes the host's network (CUBICLE_NET=1)")
		netBridge      = fs.String("net-bridge", netpool.DefaultBridge, "bridge owned by cubicle (CUBICLE_NET_BRIDGE)")
		novncDir       = fs.String("novnc-dir", "/usr/local/share/cubicle/novnc", "the @novnc/novnc package (its core/ and vendor/) served to the live-view page (CUBICLE_NOVNC_DIR)")
		publicURL      = fs.String("public-url", "", "scheme://host[:port] that live-view links point at; default: the Host each request used (CUBICLE_PUBLIC_URL)")
		viewOrigins    = fs.String("view-origins", "", "comma-separated extra Origin host patterns allowed to open live-view WebSockets (CUBICLE_VIEW_ORIGINS)")
		viewKeepsAlive = fs.Bool("view-keeps-alive", false, "an open live view counts as activity for the idle timeout (CUBICLE_VIEW_KEEPS_ALIVE=1)")
		bootTemplates  = fs.Bool("boot-templates", true, "start desktops from boot templates: the first create of an image and shape on a backend that snapshots (gvisor, qemu) boots one to a usable desktop and snapshots it, and later creates restore it; false boots every desktop (CUBICLE_BOOT_TEMPLATES)")
		e2bEnable      = fs.Bool("e2b", true, "serve E2B's control and data planes on the API port, for the unmodified e2b / @e2b/desktop SDKs (CUBICLE_E2B=0 turns it off)")
		e2bDomain      = fs.String("e2b-domain", "", "domain of E2B host routing: <port>-<sandbox>.<domain> reaches a sandbox's port (CUBICLE_E2B_DOMAIN)")
		tlsListen      = fs.String("tls-listen", "", "also serve everything over TLS on this address, e.g. :443 (CUBICLE_TLS_LISTEN)")
		tlsCert        = fs.String("tls-cert", "", "certificate (PEM, chain) for --tls-listen; a wildcard *.<e2b-domain> for E2B host routing (CUBICLE_TLS_CERT)")
		tlsKey         = fs.String("tls-key", "", "private key (PEM) for --tls-listen (CUBICLE_TLS_KEY)")
		showVersion    = fs.Bool("version", false, "print the version and exit")
		cf             clusterFlags
	)
	var pools []sandbox.PoolSpec
	fs.Var(poolsValue{&pools}, "pool", "warm pools of booted desktops that creates take instead of booting: [backend/]template:WIDTHxHEIGHT=SIZE, comma-separated or repeated, e.g. gvisor/desktop:1024x768=4 (CUBICLE_POOL)")
	fs.Var(levelValue{&level}, "log-level", "debug, info, warn or error (CUBICLE_LOG_LEVEL)")
	fs.Var(prefixValue{&netCIDR}, "net-cidr", "IPv4 network sandboxes get addresses from; its first address is the bridge/gateway (CUBICLE_NET_CIDR)")
	fs.Var(addrsValue{&netDNS}, "net-dns", "comma-separated DNS servers for sandboxes; reachable only under a sandbox's egress policy (CUBICLE_NET_DNS)")
	fs.StringVar(&cf.etcd, "cluster-etcd", "", "cluster mode: comma-separated etcd client URLs; nodes with the same etcd and API keys serve as one (README \"A cluster\"); empty = a single host (CUBICLE_CLUSTER_ETCD)")
	fs.StringVar(&cf.name, "node-name", "", "cluster mode: this node's name, unique in the cluster; default: the host name (CUBICLE_NODE_NAME)")
	fs.StringVar(&cf.advertise, "advertise-url", "", "cluster mode: http(s)://host:port the other nodes reach this node's API at; default: the --listen address when it names one (CUBICLE_ADVERTISE_URL)")
	fs.StringVar(&cf.etcdCA, "etcd-ca", "", "cluster mode: the CA file that signed etcd's https endpoints (CUBICLE_ETCD_CA)")
	fs.StringVar(&cf.etcdCert, "etcd-cert", "", "cluster mode: this node's client certificate for etcd, with --etcd-key (CUBICLE_ETCD_CERT)")
	fs.StringVar(&cf.etcdKey, "etcd-key", "", "cluster mode: the key of --etcd-cert (CUBICLE_ETCD_KEY)")
	fs.StringVar(&cf.etcdUser, "etcd-user", "", "cluster mode: etcd user, when etcd's auth is on; with --etcd-password-file (CUBICLE_ETCD_USER)")
	fs.StringVar(&cf.etcdPassFile, "etcd-password-file", "", "cluster mode: file holding the password of --etcd-user (CUBICLE_ETCD_PASSWORD_FILE)")
	fs.DurationVar(&cf.leaseTTL, "lease-ttl", cluster.DefaultLeaseTTL, "cluster mode: a node silent this long leaves the cluster and its sandboxes show as lost, at least 2s (CUBICLE_LEASE_TTL)")
	fs.IntVar(&cf.candidates, "placement-candidates", cluster.DefaultCandidates, "cluster mode: a create goes to the best (most free slots, then memory) of this many nodes drawn at random (CUBICLE_PLACEMENT_CANDIDATES)")
	conf, err := parseConfig(fs, os.Args[1:], os.Getenv)
	if *showVersion && err == nil {
		fmt.Println(version)
		return nil
	}
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	keys := apikey.ParseList(os.Getenv(apikey.EnvVar))
	if len(keys) == 0 && !isLoopback(*listen) {
		return fmt.Errorf("refusing to listen on %s without an API key: set %s", *listen, apikey.EnvVar)
	}
	inFlight := inflight.New(*maxInFlight)
	if *diskMB < 0 {
		return fmt.Errorf("%s: want a size in MiB, or 0 for no limit", conf.origin("disk-mb"))
	}
	if *usageInterval < time.Second {
		return fmt.Errorf("%s: want at least 1s", conf.origin("metrics-interval"))
	}
	if *usageWindow < *usageInterval {
		return fmt.Errorf("%s: want at least the metrics interval (%s)", conf.origin("metrics-window"), *usageInterval)
	}
	if *keyVolumes < 1 {
		return fmt.Errorf("%s: want at least 1", conf.origin("key-max-volumes"))
	}
	if *keySnapshots < 1 {
		return fmt.Errorf("%s: want at least 1", conf.origin("key-max-snapshots"))
	}
	if *recRetention < time.Minute {
		return fmt.Errorf("%s: want at least 1m", conf.origin("recording-retention"))
	}
	if *keyRecordings < 1 {
		return fmt.Errorf("%s: want at least 1", conf.origin("key-max-recordings"))
	}
	if *recMax < time.Second {
		return fmt.Errorf("%s: want at least 1s", conf.origin("recording-max-duration"))
	}
	if cf.leaseTTL < 2*time.Second {
		return fmt.Errorf("%s: want at least 2s", conf.origin("lease-ttl"))
	}
	if cf.candidates < 1 {
		return fmt.Errorf("%s: want at least 1", conf.origin("placement-candidates"))
	}
	if *maxVolumeMB < sandbox.MinVolumeMB {
		return fmt.Errorf("%s: want at least %d MiB", conf.origin("max-volume-mb"), sandbox.MinVolumeMB)
	}
	lifetime := *maxLifetime
	if lifetime == 0 {
		lifetime = -1 // unlimited
	}
	paused := *pausedLifetime
	if paused == 0 {
		paused = -1 // unlimited
	}
	if *pausedLifetime < 0 {
		return fmt.Errorf("%s: want 0 (unlimited) or more", conf.origin("paused-lifetime"))
	}

	drivers := map[string]driver.Driver{}
	for name, runtime := range map[string]string{"gvisor": "runsc", "runc": "runc"} {
		path := ""
		if runtime == "runsc" {
			path = *runscBin
		}
		drivers[name] = oci.New(oci.Config{
			Runtime:     runtime,
			RuntimePath: path,
			StateDir:    filepath.Join(*dataDir, "oci", name),
			AgentBinary: *agentBin,
			DiskMB:      *diskMB,
		})
	}
	drivers["qemu"] = qemu.New(qemu.Config{
		StateDir:    filepath.Join(*dataDir, "qemu"),
		AgentBinary: *agentBin,
		ProbeImage: func() (string, error) {
			img, err := image.Lookup(*imageDir, "desktop")
			return img.RootFS, err
		},
	})
	fc := newFirecracker(*agentBin, *imageDir)
	drivers["firecracker"] = fc
	if err := image.ValidateName(*defTemplate); err != nil {
		return fmt.Errorf("%s: %w", conf.origin("default-template"), err)
	}
	if _, ok := drivers[*defaultBackend]; !ok && *defaultBackend != "auto" {
		return fmt.Errorf("%s: want auto, firecracker, qemu, gvisor or runc", conf.origin("default-backend"))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	m := metrics.New()
	m.Registry.MustRegister(fc.Collector())
	netPool, err := newNetPool(ctx, *netEnable, *netBridge, netCIDR, netDNS, filepath.Join(*dataDir, "netpool"))
	if err != nil {
		return err
	}
	mgr, err := sandbox.New(ctx, sandbox.Config{
		DataDir:        *dataDir,
		Drivers:        drivers,
		DefaultBackend: *defaultBackend,
		Images: func(template string) (string, error) {
			img, err := image.Lookup(*imageDir, template)
			if err != nil {
				return "", errdefs.Invalid("unknown template %q: no such image in %s (build it with `cubicle image build %s`)", template, *imageDir, template)
			}
			return img.RootFS, nil
		},
		MaxSandboxes:          *maxSandboxes,
		DefaultTemplate:       *defTemplate,
		MaxPerOwner:           *keyMax,
		MaxVolumesPerOwner:    *keyVolumes,
		MaxSnapshotsPerOwner:  *keySnapshots,
		MaxVolumeMB:           *maxVolumeMB,
		RecordingRetention:    *recRetention,
		MaxRecordingsPerOwner: *keyRecordings,
		MaxRecordingDuration:  *recMax,
		FFmpeg:                *ffmpegBin,
		// Per key: the rate, with bursts of twice it (at least one create).
		OwnerCreateRate:  rate.Limit(*keyRate),
		OwnerCreateBurst: max(1, int(2**keyRate)),
		IdleTimeout:      *idleTimeout,
		MaxLifetime:      lifetime,
		PausedLifetime:   paused,
		ReadyTimeout:     *readyTimeout,
		UsageInterval:    *usageInterval,
		UsageWindow:      *usageWindow,
		Pools:            pools,
		NoTemplates:      !*bootTemplates,
		Network:          netPool,
		Metrics:          m,
		Log:              log,
	})
	if err != nil {
		return err
	}
	defer mgr.Close()

	viewKey, err := viewtoken.LoadOrCreateKey(filepath.Join(*dataDir, "view-token.key"))
	if err != nil {
		return err
	}
	tokens, err := viewtoken.New(viewKey, nil)
	if err != nil {
		return err
	}
	pages := web.New(*novncDir)
	if err := pages.NoVNCError(); err != nil {
		log.Warn("live view page unavailable (the API and WebSocket still work)", "err", err)
	}
	var origins []string
	for _, o := range strings.Split(*viewOrigins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	var mounts []api.Mount
	var cp *e2b.Server
	if *e2bEnable {
		dp := dataplane.New(dataplane.Config{TokenKey: viewKey, Domain: *e2bDomain, InFlight: inFlight}, mgr, log)
		templates := map[string]string{"desktop": "desktop", "base": "base"}
		if _, err := image.Lookup(*imageDir, "base"); err != nil {
			// No plain image built: E2B's default template gets the
			// lighter desktop (E2B's base has none at all).
			templates["base"] = "desktop"
			if _, err := image.Lookup(*imageDir, "desktop-lite"); err == nil {
				templates["base"] = "desktop-lite"
			}
		}
		cp = e2b.New(e2b.Config{APIKeys: keys, TokenKey: viewKey, Domain: *e2bDomain, Templates: templates}, mgr, log)
		mounts = append(mounts,
			api.Mount{Name: "e2b-data", Claims: func(r *http.Request) bool { _, ok := dp.Match(r); return ok }, Handler: dp,
				Sandbox: func(r *http.Request) string { t, _ := dp.Match(r); return t.ID }},
			api.Mount{Name: "e2b", Claims: func(r *http.Request) bool { return e2b.OwnsPath(r.URL.Path) }, Handler: cp,
				Sandbox: func(r *http.Request) string { return e2b.SandboxOfPath(r.URL.Path) }, Creates: e2b.IsCreate, Placeable: cp.Placeable,
				Refuse: cp.WriteError},
		)
	}
	// Listen before the API is built: /mcp calls the REST API on this
	// listener, over loopback.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	mcpHandler := mcp.NewHTTPHandler(mcp.HTTPConfig{
		DaemonURL:    "http://" + loopbackAddr(ln.Addr()),
		KeysRequired: len(keys) > 0,
		Version:      version,
		Log:          log,
	})
	clu, stopCluster, err := startCluster(ctx, cf, ln.Addr(), mgr, *dataDir, m, log)
	if err != nil {
		ln.Close()
		return fmt.Errorf("cluster: %w", err)
	}
	defer stopCluster()
	var apiCluster api.Cluster
	if clu != nil {
		apiCluster = clu
	}
	handler := api.New(api.Config{
		APIKeys:        keys,
		InFlight:       inFlight,
		Version:        version,
		ViewTokens:     tokens,
		Pages:          pages,
		PublicURL:      *publicURL,
		ViewOrigins:    origins,
		ViewKeepsAlive: *viewKeepsAlive,
		Context:        ctx,
		Mounts:         mounts,
		MCP:            mcpHandler,
		Cluster:        apiCluster,
	}, mgr, m, log)
	if cp != nil && clu != nil {
		// E2B's lists span the cluster, as the native one does.
		cp.SetElsewhere(handler.Elsewhere)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	// The settings that shape every sandbox, so an operator (and the
	// configuration test) sees what the flags and variables came to.
	log.Info("cubicled listening", "addr", ln.Addr().String(), "version", version, "default_backend", *defaultBackend,
		"max_sandboxes", *maxSandboxes, "idle_timeout", idleTimeout.String(), "max_lifetime", maxLifetime.String(),
		"ready_timeout", readyTimeout.String(), "disk_mb", *diskMB, "net", *netEnable, "e2b", *e2bEnable)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	var tlsSrv *http.Server
	if *tlsListen != "" {
		if *tlsCert == "" || *tlsKey == "" {
			return errors.New("--tls-listen needs --tls-cert and --tls-key")
		}
		tln, err := net.Listen("tcp", *tlsListen)
		if err != nil {
			return fmt.Errorf("listen tls: %w", err)
		}
		tlsSrv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		log.Info("cubicled listening (TLS)", "addr", tln.Addr().String())
		go func() { errc <- tlsSrv.ServeTLS(tln, *tlsCert, *tlsKey) }()
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// Graceful: stop accepting, let requests finish, leave sandboxes running
	// for the next daemon to re-adopt.
	log.Info("shutting down; sandboxes stay running")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if tlsSrv != nil {
		if err := tlsSrv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("shutdown tls: %w", err)
		}
	}
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	// Live views saw ctx end and are closing; let their close frames out.
	if err := handler.WaitViews(sctx); err != nil {
		log.Warn("live views still open at exit", "err", err)
	}
	return nil
}

// isLoopback reports whether addr (host:port) only listens on loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackAddr is how the daemon reaches its own listener: the loopback
// address of a listener on every address, the listener's address otherwise.
func loopbackAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if tcp.IP.IsUnspecified() {
		// Go's wildcard listeners are dual-stack.
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
	}
	return tcp.String()
}

// newNetPool sets up sandbox networking when enabled; nil means sandboxes
// have loopback only.
func newNetPool(ctx context.Context, enable bool, bridge string, cidr netip.Prefix, dns []netip.Addr, stateDir string) (sandbox.NetPool, error) {
	if !enable {
		return nil, nil
	}
	p, err := netpool.New(ctx, netpool.Config{Bridge: bridge, CIDR: cidr, DNS: dns, StateDir: stateDir})
	if err != nil {
		return nil, fmt.Errorf("sandbox network: %w", err)
	}
	return p, nil
}

// newFirecracker configures the firecracker backend; without its binaries,
// KVM or the unprivileged VMM user, or until a probe boot of the desktop
// image's kernel has worked, its Available says why.
func newFirecracker(agentBin, imageDir string) *firecracker.Driver {
	uid, gid := 0, 0 // 0 makes Available refuse the backend, with the reason
	if u, err := user.Lookup(envOr("CUBICLE_FIRECRACKER_USER", "cubicle-vm")); err == nil {
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	return firecracker.New(firecracker.Config{
		FirecrackerBin: envOr("CUBICLE_FIRECRACKER_BIN", "firecracker"),
		JailerBin:      envOr("CUBICLE_JAILER_BIN", "jailer"),
		ChrootBase:     envOr("CUBICLE_FIRECRACKER_CHROOT", firecracker.DefaultChrootBase),
		UID:            uid,
		GID:            gid,
		AgentBinary:    agentBin,
		ProbeImage: func() (string, error) {
			img, err := image.Lookup(imageDir, "desktop")
			return img.RootFS, err
		},
	})
}
