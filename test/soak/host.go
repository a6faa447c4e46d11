package main

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// netnsEnv marks the soak's own re-execution inside a new network namespace.
const netnsEnv = "CUBICLE_SOAK_IN_NETNS"

// inOwnNetns re-executes this program under `unshare --net` unless it
// already runs there, so that the daemon's bridge, veths and nft tables
// live in a namespace that vanishes with the run and nothing touches the
// host's own network. In the child it brings lo up and returns true; in
// the parent it returns false after the child ended, with its error.
func inOwnNetns() (bool, error) {
	if os.Getenv(netnsEnv) == "1" {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			return true, fmt.Errorf("lo up: %w", err)
		}
		return true, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	cmd := exec.Command("unshare", append([]string{"--net", "--", exe}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return false, fmt.Errorf("soak in its own network namespace: %w", err)
	}
	return false, nil
}

// smallFS makes a sparse ext4 filesystem of sizeMB at img and mounts it at
// dir (loop device with autoclear), for a data directory that the
// "data dir full" fault can fill without touching the host's disk. The
// returned function unmounts it and removes the file.
func smallFS(img, dir string, sizeMB int) (func(), error) {
	f, err := os.Create(img)
	if err != nil {
		return nil, err
	}
	err = f.Truncate(int64(sizeMB) << 20)
	f.Close()
	if err != nil {
		os.Remove(img)
		return nil, err
	}
	for _, args := range [][]string{
		{"mkfs.ext4", "-q", "-F", "-m", "0", img},
		{"mount", "-o", "loop", img, dir},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			os.Remove(img)
			return nil, fmt.Errorf("%s: %v: %s", args[0], err, out)
		}
	}
	return func() {
		if err := unix.Unmount(dir, 0); err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
		os.Remove(img)
	}, nil
}

// fill takes every free block of the filesystem at dir with one file and
// returns its path.
func fill(dir string) (string, error) {
	path := filepath.Join(dir, "soak-filler")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return path, err
	}
	free := int64(st.Bavail) * st.Bsize
	// fallocate of the whole free space can fall short by the metadata
	// it needs itself; top up with smaller pieces until ENOSPC.
	var off int64
	for size := free; size >= 4096; size /= 2 {
		for {
			err := unix.Fallocate(int(f.Fd()), 0, off, size)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				return path, fmt.Errorf("fallocate: %w", err)
			}
			off += size
		}
	}
	return path, nil
}

// poolCIDR is the smallest IPv4 network under 10.89.77.0 with at least
// n+spare guest addresses (network, broadcast and gateway excluded).
func poolCIDR(n, spare int) string {
	need := n + spare + 3
	hostBits := bits.Len(uint(need - 1))
	return fmt.Sprintf("10.89.77.0/%d", 32-hostBits)
}

// poolSize is the number of guest addresses of a poolCIDR network.
func poolSize(cidr string) int {
	var prefix int
	fmt.Sscanf(cidr[strings.Index(cidr, "/")+1:], "%d", &prefix)
	return 1<<(32-prefix) - 3
}

// sandboxLinks lists the host ends of sandbox veths and TAPs.
func sandboxLinks() []string {
	links, _ := netlink.LinkList()
	var out []string
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, "cbv") || strings.HasPrefix(n, "cbt") {
			out = append(out, n)
		}
	}
	return out
}

// loopsUnder lists the loop devices whose backing file is under dir.
func loopsUnder(dir string) []string {
	var out []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir+"/") {
			out = append(out, strings.Split(f, "/")[3]+" → "+strings.TrimSpace(string(b)))
		}
	}
	return out
}
