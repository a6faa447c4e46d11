package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The VM form of an image lives next to its rootfs, in the same version
// directory, so it is built, cached, published and collected with it:
//
//	disk.ext4          the rootfs as an ext4 file system (sparse file)
//	kernel/vmlinuz     the guest kernel as shipped (bzImage; QEMU boots it)
//	kernel/vmlinux     the same kernel uncompressed (ELF; Firecracker needs it)
//	kernel/release     the kernel release, e.g. 6.1.0-57-amd64
//	kernel/modules/    the .ko files of VMModules and their dependencies,
//	                   and order, their load order
//
// The initramfs is not part of the image: it carries the agent binary, which
// belongs to the daemon, so drivers make it with Initramfs.
const (
	diskFile  = "disk.ext4"
	kernelDir = "kernel"
)

// DefaultVMFreeMB is the free space a VM disk gets on top of the rootfs when
// the recipe says nothing.
const DefaultVMFreeMB = 512

// VM is the VM form of an image version.
type VM struct {
	Dir     string // the image version directory
	Disk    string // ext4 root file system; never written by drivers
	Kernel  string // bzImage
	Vmlinux string // uncompressed ELF kernel; "" when it could not be extracted
	Modules string // directory of .ko files named in its file "order"
	Release string // kernel release
}

// ErrNoVM means an image has no VM form (no disk or no kernel).
var ErrNoVM = errors.New("image has no VM form")

// LookupVM returns the VM form of the image whose rootfs (as drivers get it
// in driver.Spec.Image) or version directory is path.
func LookupVM(path string) (VM, error) {
	dir, err := filepath.EvalSymlinks(path)
	if err != nil {
		return VM{}, err
	}
	if filepath.Base(dir) == "rootfs" {
		dir = filepath.Dir(dir)
	}
	vm := VM{
		Dir:     dir,
		Disk:    filepath.Join(dir, diskFile),
		Kernel:  filepath.Join(dir, kernelDir, "vmlinuz"),
		Vmlinux: filepath.Join(dir, kernelDir, "vmlinux"),
		Modules: filepath.Join(dir, kernelDir, "modules"),
	}
	if _, err := os.Stat(vm.Disk); err != nil {
		return VM{}, fmt.Errorf("%w: %s: no %s (rebuild the image with a recipe that has a \"vm\" section, or re-import it)", ErrNoVM, dir, diskFile)
	}
	if _, err := os.Stat(vm.Kernel); err != nil {
		return VM{}, fmt.Errorf("%w: %s: no guest kernel", ErrNoVM, dir)
	}
	if _, err := os.Stat(vm.Vmlinux); err != nil {
		vm.Vmlinux = ""
	}
	rel, err := os.ReadFile(filepath.Join(dir, kernelDir, "release"))
	if err != nil {
		return VM{}, fmt.Errorf("%w: %s: %v", ErrNoVM, dir, err)
	}
	vm.Release = strings.TrimSpace(string(rel))
	return vm, nil
}

// moduleList returns the module file names in load order.
func (vm VM) moduleList() ([]string, error) {
	data, err := os.ReadFile(filepath.Join(vm.Modules, "order"))
	if err != nil {
		return nil, fmt.Errorf("kernel modules: %w", err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			if strings.ContainsAny(l, "/\x00") {
				return nil, fmt.Errorf("kernel modules: bad name %q", l)
			}
			out = append(out, l)
		}
	}
	return out, nil
}

// installKernel installs the kernel found in pkgRoot (an unpacked
// linux-image package, or a rootfs that has one: boot/vmlinuz-RELEASE and
// lib/modules/RELEASE) into ver/kernel. It reports false when pkgRoot holds
// no kernel.
func installKernel(pkgRoot, ver string) (bool, error) {
	kernels, _ := filepath.Glob(filepath.Join(pkgRoot, "boot", "vmlinuz-*"))
	var kernel, release string
	for _, k := range kernels {
		rel := strings.TrimPrefix(filepath.Base(k), "vmlinuz-")
		if fi, err := os.Stat(filepath.Join(pkgRoot, "lib", "modules", rel)); err == nil && fi.IsDir() {
			kernel, release = k, rel // the last one: Glob sorts, newest usually last
		}
	}
	if kernel == "" {
		return false, nil
	}
	dst := filepath.Join(ver, kernelDir)
	mods := filepath.Join(dst, "modules")
	if err := os.MkdirAll(mods, 0o755); err != nil {
		return false, err
	}
	if err := copyFile(kernel, filepath.Join(dst, "vmlinuz"), 0o644); err != nil {
		return false, err
	}
	bz, err := os.ReadFile(kernel)
	if err != nil {
		return false, err
	}
	// A kernel Firecracker cannot boot is still fine for QEMU: no vmlinux
	// then, and LookupVM reports Vmlinux "".
	if elfKernel, err := ExtractVmlinux(bz); err == nil {
		if err := os.WriteFile(filepath.Join(dst, "vmlinux"), elfKernel, 0o644); err != nil {
			return false, err
		}
	}
	order, err := ResolveModules(filepath.Join(pkgRoot, "lib", "modules", release), VMModules)
	if err != nil {
		return false, fmt.Errorf("kernel modules: %w", err)
	}
	var names strings.Builder
	for _, m := range order {
		if err := copyFile(m, filepath.Join(mods, filepath.Base(m)), 0o644); err != nil {
			return false, err
		}
		names.WriteString(filepath.Base(m) + "\n")
	}
	if err := os.WriteFile(filepath.Join(mods, "order"), []byte(names.String()), 0o644); err != nil {
		return false, err
	}
	return true, os.WriteFile(filepath.Join(dst, "release"), []byte(release+"\n"), 0o644)
}

// linkKernel gives ver the kernel of another image version from: imports
// of rootfs tarballs rarely carry a kernel, and the guest kernel does not
// depend on the userland above it. Files are hard-linked when possible.
func linkKernel(from VM, ver string) error {
	src := filepath.Join(from.Dir, kernelDir)
	dst := filepath.Join(ver, kernelDir)
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if os.Link(p, target) == nil {
			return nil
		}
		return copyFile(p, target, 0o644)
	})
}

// makeDisk writes rootfs as an ext4 file system into the sparse file out,
// with mkfs.ext4 -d (no loop mount, no root-only kernel feature): sized to
// the rootfs's allocated blocks plus a tenth, 64 MiB for metadata and
// freeMB of free space for the sandbox's writes.
func makeDisk(ctx context.Context, rootfs, out string, freeMB int) error {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return fmt.Errorf("mkfs.ext4 not found on PATH (apt-get install e2fsprogs): %w", err)
	}
	var used, files int64
	err := filepath.WalkDir(rootfs, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		files++
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			used += st.Blocks * 512
		} else {
			used += fi.Size()
		}
		return nil
	})
	if err != nil {
		return err
	}
	if freeMB <= 0 {
		freeMB = DefaultVMFreeMB
	}
	size := used + used/10 + 64<<20 + int64(freeMB)<<20
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	inodes := files + files/5 + 16384
	f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "cubicle-root", "-m", "0",
		"-N", strconv.FormatInt(inodes, 10), "-d", rootfs, out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 10 * time.Second
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 -d %s: %w: %s", rootfs, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// kernelScript runs in the build chroot after the packages are installed
// (while apt's lists are still there): it downloads the guest kernel
// package, without installing it into the rootfs — the sandbox's userland
// does not need 400 MB of modules, and no initramfs-tools run in the chroot
// — and unpacks it into /tmp/cubicle-kernel for vmImage to pick up.
// A metapackage such as linux-image-amd64 is resolved to the package it
// depends on.
const kernelScript = `pkg=%s
dep=$(apt-cache depends "$pkg" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$dep" ] && pkg=$dep
rm -rf /tmp/cubicle-kernel /tmp/cubicle-kernel-deb && mkdir -p /tmp/cubicle-kernel /tmp/cubicle-kernel-deb
cd /tmp/cubicle-kernel-deb && apt-get -o APT::Sandbox::User=root download "$pkg"
dpkg-deb -x /tmp/cubicle-kernel-deb/*.deb /tmp/cubicle-kernel
rm -rf /tmp/cubicle-kernel-deb
cd /
`

// vmImage makes the VM form of the image being built: the kernel unpacked
// by kernelScript, then the disk from the finished rootfs.
func (b *builder) vmImage(ctx context.Context) error {
	ver := filepath.Dir(b.rootfs)
	pkg := filepath.Join(b.rootfs, "tmp", "cubicle-kernel")
	ok, err := installKernel(pkg, ver)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("no kernel in package %s", b.r.VM.Kernel)
	}
	if err := os.RemoveAll(pkg); err != nil {
		return err
	}
	return makeDisk(ctx, b.rootfs, filepath.Join(ver, diskFile), b.r.VM.FreeMB)
}

// importVM makes the VM form of an imported image: its own kernel if the
// tarball has one, else the kernel of the image opts.KernelFrom in the same
// image directory; then the disk. It returns where the kernel came from:
// "" for the tarball's own, or the image name; "" and no error also when the
// default kernel image is not there (the image then runs on container
// backends only, and LookupVM says why not on VMs).
func importVM(ctx context.Context, imageDir, ver string, opts ImportOptions) (string, error) {
	rootfs := filepath.Join(ver, "rootfs")
	ok, err := installKernel(rootfs, ver)
	if err != nil {
		return "", fmt.Errorf("kernel: %w", err)
	}
	from := ""
	if !ok {
		name, explicit := opts.KernelFrom, opts.KernelFrom != ""
		if !explicit {
			name = DefaultKernelFrom
		}
		vm, err := kernelImage(imageDir, name)
		switch {
		case err == nil:
			if err := linkKernel(vm, ver); err != nil {
				return "", fmt.Errorf("kernel of image %s: %w", name, err)
			}
			from = name
		case explicit:
			return "", fmt.Errorf("--kernel %s: %w", name, err)
		}
	}
	if err := makeDisk(ctx, rootfs, filepath.Join(ver, diskFile), DefaultVMFreeMB); err != nil {
		return "", fmt.Errorf("vm disk: %w", err)
	}
	return from, nil
}

// kernelImage returns the VM form of the installed image name, which must
// have a kernel.
func kernelImage(imageDir, name string) (VM, error) {
	img, err := Lookup(imageDir, name)
	if err != nil {
		return VM{}, err
	}
	dir := filepath.Join(img.Dir, kernelDir)
	if _, err := os.Stat(filepath.Join(dir, "vmlinuz")); err != nil {
		return VM{}, fmt.Errorf("%w: image %s has no guest kernel", ErrNoVM, name)
	}
	return VM{Dir: img.Dir}, nil
}
