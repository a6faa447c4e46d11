// Package netpooltest holds helpers for tests that need a network of their
// own: run a test inside a fresh network namespace, make further namespaces
// ("the internet", with servers at chosen addresses), listen and dial from
// inside a namespace. Nothing here touches the host's own network: every
// link and address is made inside namespaces the test created. Only tests
// import it.
package netpooltest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/needs"
)

// ChildEnv names the test a re-executed test binary runs in its own
// network namespace.
const ChildEnv = "CUBICLE_NETNS_TEST_CHILD"

// InOwnNetns makes the calling (top-level) test run in a network namespace
// of its own. In the parent it re-executes the test binary under `unshare
// --net` for just this test, relays its output and result, and returns
// false; in that child it brings lo up and returns true. Every process the
// child starts (a cubicled, runsc) inherits the namespace.
func InOwnNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(ChildEnv) == t.Name() {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Fatalf("lo up: %v", err)
		}
		return true
	}
	needs.Root(t)
	needs.Command(t, "unshare")
	args := []string{"--net", "--", os.Args[0], "-test.run=^" + t.Name() + "$", "-test.v", "-test.count=1"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	cmd := exec.Command("unshare", args...)
	cmd.Env = append(os.Environ(), ChildEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("in a new network namespace:\n%s", out)
	if err != nil {
		t.Fatalf("test in its own network namespace: %v", err)
	}
	return false
}

// Do runs fn on a thread switched into the namespace at path ("" = the
// caller's). Sockets made in fn stay in that namespace.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- err
			return
		}
		ns, err := netns.GetFromPath(path)
		if err != nil {
			ch <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- err
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			ch <- errors.Join(err, rerr) // the thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		ch <- err
	}()
	return <-ch
}

// Listen serves TCP on addr in namespace path ("" = here), closing every
// connection at once; it stops at the end of the test.
func Listen(t testing.TB, path, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := Do(path, func() (err error) { ln, err = net.Listen("tcp4", addr); return err })
	if err != nil {
		t.Fatalf("listen %s in %q: %v", addr, path, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Dial connects from namespace path ("" = here) to addr.
func Dial(path, addr string) error {
	return Do(path, func() error {
		c, err := net.DialTimeout("tcp4", addr, 700*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// Peer makes a network namespace bind-mounted at dir/name, joined to the
// caller's namespace by a veth: the caller's end hostIf gets hostAddr, the
// namespace's eth0 gets every one of addrs (same prefix length), and lo is
// up. It returns the namespace's path; it is removed at the end of the test.
func Peer(t testing.TB, dir, name, hostIf string, hostAddr netip.Prefix, addrs ...netip.Prefix) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := newNetns(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
	})
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostIf); err == nil {
			netlink.LinkDel(l)
		}
	})
	if err := Do(path, func() error {
		for _, n := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if n == "eth0" {
				for _, a := range addrs {
					if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet(a)}); err != nil {
						return err
					}
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(hostIf)
	if err == nil {
		err = netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet(hostAddr)})
	}
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Wait until both ends have carrier: a veth drops what it is given
	// until the kernel has processed that (see netpool's waitOperUp).
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		up := 0
		for _, ns := range []string{"", path} {
			name := hostIf
			if ns != "" {
				name = "eth0"
			}
			Do(ns, func() error {
				if l, err := netlink.LinkByName(name); err == nil && l.Attrs().OperState == netlink.OperUp {
					up++
				}
				return nil
			})
		}
		if up == 2 {
			break
		}
	}
	return path
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// newNetns makes a network namespace bind-mounted at path.
func newNetns(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- err
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- err
			return
		}
		err = unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "none", unix.MS_BIND, "")
		if rerr := netns.Set(orig); rerr != nil {
			ch <- errors.Join(err, rerr)
			return
		}
		runtime.UnlockOSThread()
		ch <- err
	}()
	return <-ch
}
