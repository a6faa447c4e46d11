package firecracker

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ownTAP makes the persistent TAP name (in the network namespace at
// netnsPath, "" for the daemon's) openable by uid and gid, the user the
// jailer runs Firecracker as. The daemon's network pool makes TAPs owned
// by no one, which only a process with CAP_NET_ADMIN may attach to — right
// for QEMU, which runs as root, but the jailed Firecracker has no
// capabilities, and its TUNSETIFF at PUT /network-interfaces fails with
// EPERM. Ownership is given here, per VM, by the driver that knows the
// user, rather than by the pool for every TAP: attaching to the TAP once
// (TUNSETIFF with the flags Firecracker uses) and setting TUNSETOWNER and
// TUNSETGROUP, which persist with the device.
func ownTAP(netnsPath, name string, uid, gid int) error {
	own := func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("attach: %w", err)
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, uid); err != nil {
			return fmt.Errorf("TUNSETOWNER %d: %w", uid, err)
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETGROUP, gid); err != nil {
			return fmt.Errorf("TUNSETGROUP %d: %w", gid, err)
		}
		return nil
	}
	var err error
	if netnsPath == "" {
		err = own()
	} else {
		err = inNetns(netnsPath, own)
	}
	if err != nil {
		return fmt.Errorf("give tap %s to uid %d gid %d: %w", name, uid, gid, err)
	}
	return nil
}

// inNetns runs fn on an OS thread switched into the network namespace at
// path. The thread goes back to the daemon's namespace afterwards or, if
// that fails, ends with its goroutine.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			errc <- errors.Join(err, fmt.Errorf("restore netns: %w", rerr)) // the thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
