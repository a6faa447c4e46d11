package netpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// Defaults for zero Config fields.
const (
	DefaultBridge   = "cubicle0"
	DefaultCIDR     = "10.88.0.0/16"
	DefaultNetnsDir = "/run/netns"
)

// Config configures a Pool.
type Config struct {
	// Bridge is the name of the bridge the pool owns; default "cubicle0".
	Bridge string
	// CIDR is the IPv4 network guests get addresses from; its first
	// address is the gateway, on the bridge. Default 10.88.0.0/16.
	CIDR netip.Prefix
	// DNS servers written into each guest's resolv.conf (or handed to a
	// VM). They are not allowed through automatically: a sandbox reaches
	// them only if its egress policy allows their addresses.
	DNS []netip.Addr
	// StateDir holds one JSON file per attachment (required), e.g.
	// /var/lib/cubicle/netpool.
	StateDir string
	// NetnsDir is where per-sandbox network namespaces are bind-mounted;
	// default /run/netns, where `ip netns` sees them.
	NetnsDir string
}

// attachment is one sandbox's network, as persisted in StateDir.
type attachment struct {
	ID     string         `json:"id"`
	Kind   string         `json:"kind"`
	Addr   netip.Addr     `json:"addr"`
	HostIf string         `json:"host_if"`
	Netns  string         `json:"netns,omitempty"`
	MAC    string         `json:"mac"`
	Allow  []netip.Prefix `json:"allow,omitempty"`
}

// Pool attaches sandboxes to cubicle's bridge. It is safe for concurrent
// use. One Pool per network namespace and state directory.
type Pool struct {
	cfg Config

	mu    sync.Mutex
	addrs *addrPool
	atts  map[string]*attachment
}

// New sets up the bridge, ip_forward and the nftables tables, and takes back
// the attachments persisted in cfg.StateDir by an earlier daemon (their
// addresses stay taken until Detach or Cleanup). It needs CAP_NET_ADMIN.
func New(ctx context.Context, cfg Config) (*Pool, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if len(cfg.Bridge) > 15 {
		return nil, fmt.Errorf("netpool: bridge name %q is longer than 15 characters", cfg.Bridge)
	}
	if !cfg.CIDR.IsValid() {
		cfg.CIDR = netip.MustParsePrefix(DefaultCIDR)
	}
	cfg.CIDR = cfg.CIDR.Masked()
	if cfg.NetnsDir == "" {
		cfg.NetnsDir = DefaultNetnsDir
	}
	if cfg.StateDir == "" {
		return nil, errors.New("netpool: no state directory")
	}
	addrs, err := newAddrPool(cfg.CIDR)
	if err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, addrs: addrs, atts: make(map[string]*attachment)}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("netpool: %w", err)
	}
	if err := p.load(); err != nil {
		return nil, err
	}
	if err := setupBridge(cfg.Bridge, netip.PrefixFrom(addrs.gateway, cfg.CIDR.Bits())); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.applyLocked(); err != nil {
		return nil, err
	}
	return p, nil
}

// load reads the persisted attachments.
func (p *Pool) load() error {
	ents, err := os.ReadDir(p.cfg.StateDir)
	if err != nil {
		return fmt.Errorf("netpool: %w", err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(p.cfg.StateDir, e.Name()))
		if err != nil {
			return fmt.Errorf("netpool: %w", err)
		}
		var a attachment
		if err := json.Unmarshal(data, &a); err != nil || validID(a.ID) != nil || a.ID+".json" != e.Name() {
			return fmt.Errorf("netpool: bad state file %s: %v", e.Name(), err)
		}
		if err := p.addrs.claim(a.Addr, a.ID); err != nil {
			return fmt.Errorf("%w (was --net-cidr changed while sandboxes ran?)", err)
		}
		p.atts[a.ID] = &a
	}
	return nil
}

func (p *Pool) statePath(id string) string { return filepath.Join(p.cfg.StateDir, id+".json") }

// persist writes a's state file atomically.
func (p *Pool) persist(a *attachment) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tmp := p.statePath(a.ID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p.statePath(a.ID))
}

func (p *Pool) applyLocked() error {
	atts := make([]*attachment, 0, len(p.atts))
	for _, a := range p.atts {
		atts = append(atts, a)
	}
	return apply(ruleset(p.cfg.Bridge, p.cfg.CIDR, atts))
}

// Gateway is the bridge's address, the guests' default gateway.
func (p *Pool) Gateway() netip.Addr { return p.addrs.gateway }

// Free returns the number of unallocated guest addresses.
func (p *Pool) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs.free()
}

// Attach gives sandbox id a network of kind "veth" (KindVeth) or "tap"
// (KindTAP) whose egress is limited to allow: nil or empty allows nothing,
// 0.0.0.0/0 (and ::/0) everything. The rules are in force before the device
// exists. On error nothing of it is left. Attaching an attached id again
// returns its existing network.
func (p *Pool) Attach(ctx context.Context, id, kind string, allow []netip.Prefix) (*driver.Net, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if kind != KindVeth && kind != KindTAP {
		return nil, fmt.Errorf("netpool: unknown attachment kind %q (want %q or %q)", kind, KindVeth, KindTAP)
	}
	allow = slices.Clone(allow)
	for i, a := range allow {
		if !a.IsValid() {
			return nil, fmt.Errorf("netpool: invalid allow prefix #%d", i)
		}
		allow[i] = a.Masked()
	}
	p.mu.Lock()
	if a, ok := p.atts[id]; ok {
		p.mu.Unlock()
		return p.net(a), nil
	}
	addr, err := p.addrs.allocate(id)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	a := &attachment{ID: id, Kind: kind, Addr: addr, HostIf: hostIfName(kind, id),
		MAC: guestMAC(id).String(), Allow: allow}
	if kind == KindVeth {
		a.Netns = filepath.Join(p.cfg.NetnsDir, netnsName(id))
	}
	p.atts[id] = a
	// Persist before making anything, so that a crash at any later point
	// leaves a record Cleanup finds.
	err = p.persist(a)
	if err == nil {
		err = p.applyLocked()
	}
	p.mu.Unlock()
	if err == nil {
		err = p.create(ctx, a)
	}
	if err != nil {
		if derr := p.Detach(context.WithoutCancel(ctx), id); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, fmt.Errorf("netpool: attach %s: %w", id, err)
	}
	return p.net(a), nil
}

// SetEgress replaces sandbox id's egress policy by allow (as Attach's).
// Connections the policy no longer allows stay up until they end, as
// they would after a rule change anywhere; a warm-pool box, the one
// caller, has made none. On error the old policy stays in force.
func (p *Pool) SetEgress(ctx context.Context, id string, allow []netip.Prefix) error {
	allow = slices.Clone(allow)
	for i, a := range allow {
		if !a.IsValid() {
			return fmt.Errorf("netpool: invalid allow prefix #%d", i)
		}
		allow[i] = a.Masked()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.atts[id]
	if !ok {
		return fmt.Errorf("netpool: set egress of %s: not attached", id)
	}
	was := a.Allow
	a.Allow = allow
	err := p.persist(a)
	if err == nil {
		err = p.applyLocked()
	}
	if err != nil {
		a.Allow = was
		return errors.Join(fmt.Errorf("netpool: set egress of %s: %w", id, err), p.persist(a), p.applyLocked())
	}
	return nil
}

func (p *Pool) net(a *attachment) *driver.Net {
	n := &driver.Net{
		Netns:   a.Netns,
		MAC:     a.MAC,
		Addr:    netip.PrefixFrom(a.Addr, p.cfg.CIDR.Bits()),
		Gateway: p.addrs.gateway,
		DNS:     slices.Clone(p.cfg.DNS),
	}
	if a.Kind == KindTAP {
		n.TAP = a.HostIf
	}
	return n
}

// create makes a's devices.
func (p *Pool) create(ctx context.Context, a *attachment) error {
	gw := p.addrs.gateway
	addr := netip.PrefixFrom(a.Addr, p.cfg.CIDR.Bits())
	forgetNeighbor(p.cfg.Bridge, a.Addr)
	if a.Kind == KindTAP {
		return createTAP(p.cfg.Bridge, a.HostIf)
	}
	return createVeth(p.cfg.Bridge, a.HostIf, a.Netns, guestMAC(a.ID), addr, gw)
}

// Detach removes sandbox id's devices, namespace, rules and conntrack
// entries, then frees its address. It is safe to call more than once, and
// for an id that was never attached.
func (p *Pool) Detach(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	p.mu.Lock()
	a, ok := p.atts[id]
	p.mu.Unlock()
	if !ok {
		// Nothing recorded: still remove what the names say could be
		// there (a crash between making and recording cannot happen,
		// but this keeps Detach idempotent whatever the state).
		a = &attachment{ID: id, Kind: KindVeth, HostIf: hostIfName(KindVeth, id), Netns: filepath.Join(p.cfg.NetnsDir, netnsName(id))}
		errs := []error{deleteLink(a.HostIf), deleteLink(hostIfName(KindTAP, id)), removeNetns(a.Netns)}
		return errors.Join(errs...)
	}
	// Devices first, then the address: it must not be handed out while
	// anything still carries it.
	var errs []error
	errs = append(errs, deleteLink(a.HostIf))
	if a.Netns != "" {
		errs = append(errs, removeNetns(a.Netns))
	}
	flushConntrack(a.Addr)
	forgetNeighbor(p.cfg.Bridge, a.Addr)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netpool: detach %s: %w", id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.atts, id)
	if err := p.applyLocked(); err != nil {
		p.atts[id] = a // keep the record so a later Detach or Cleanup retries
		return fmt.Errorf("netpool: detach %s: %w", id, err)
	}
	if err := os.Remove(p.statePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.atts[id] = a
		return fmt.Errorf("netpool: detach %s: %w", id, err)
	}
	p.addrs.release(a.Addr)
	return nil
}

// Cleanup detaches every attachment whose sandbox is not in keep, and
// deletes any port of the bridge with a pool name that no attachment owns.
// It is run at daemon start, after the manager has re-adopted its
// sandboxes.
func (p *Pool) Cleanup(ctx context.Context, keep map[string]bool) error {
	p.mu.Lock()
	var drop []string
	owned := make(map[string]bool)
	for id, a := range p.atts {
		if keep[id] {
			owned[a.HostIf] = true
		} else {
			drop = append(drop, id)
		}
	}
	p.mu.Unlock()
	var errs []error
	for _, id := range drop {
		errs = append(errs, p.Detach(ctx, id))
	}
	ports, err := bridgePorts(p.cfg.Bridge)
	errs = append(errs, err)
	for _, name := range ports {
		if (strings.HasPrefix(name, vethPrefix) || strings.HasPrefix(name, tapPrefix)) && !owned[name] {
			errs = append(errs, deleteLink(name))
		}
	}
	return errors.Join(errs...)
}

// Teardown detaches everything and removes the nftables tables and the
// bridge: for tests and uninstalling. The Pool must not be used afterwards.
func (p *Pool) Teardown(ctx context.Context) error {
	err := p.Cleanup(ctx, nil)
	return errors.Join(err, removeTables(), deleteLink(p.cfg.Bridge))
}
