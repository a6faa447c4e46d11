package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// fromHash mixes the identity of the parent image into a child recipe's
// hash, so rebuilding the parent (a new version directory) rebuilds every
// image made from it.
func fromHash(hash string, parent Image) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00from\x00%s\x00%s\x00%s", hash, parent.Name, filepath.Base(parent.Dir), parent.RecipeHash)
	return hex.EncodeToString(h.Sum(nil))
}

// copyParent starts the child's root filesystem as a copy of the parent's.
// cp -a keeps owners, modes, hard links, xattrs (file capabilities) and
// symlinks as they are; --reflink=auto makes it nearly free on a file
// system that can share blocks.
func (b *builder) copyParent(ctx context.Context) error {
	return b.run(ctx, "cp", "-a", "--reflink=auto", "--", b.parent.RootFS, b.rootfs) //depcheck:runs cp
}

// vmFromParent gives the child the parent's guest kernel (linked, not
// copied) and a disk of its own root filesystem.
func (b *builder) vmFromParent(ctx context.Context) error {
	ver := filepath.Dir(b.rootfs)
	if err := linkKernel(VM{Dir: b.parent.Dir}, ver); err != nil {
		return fmt.Errorf("kernel of image %s: %w", b.parent.Name, err)
	}
	free := 0
	if b.r.VM != nil {
		free = b.r.VM.FreeMB
	}
	return makeDisk(ctx, b.rootfs, filepath.Join(ver, diskFile), free)
}

// Where a recipe's Chromium section lands. "zz-" sorts after the base
// image's cubicle.json, and Chromium lets the policy file that sorts last
// win a conflict. cubicle-browser reads the flag files in name order and
// Chromium takes a switch's last value; the agent's DevTools file
// (zz-cubicle-devtools) sorts after "recipe", so the port cubicled dials
// stays the one Chromium serves.
const (
	recipePolicyFile = "etc/chromium/policies/managed/zz-recipe.json"
	recipeFlagFile   = "etc/cubicle/chromium-flags.d/recipe"
)

// addChromium writes the recipe's Chromium policies and flags, merged with
// what a parent recipe wrote there: the child's policy keys win, its flags
// come after the parent's.
func addChromium(root *os.Root, c *ChromiumRecipe) error {
	if c == nil {
		return nil
	}
	if len(c.Policies) > 0 {
		policies := map[string]json.RawMessage{}
		if old, err := root.ReadFile(recipePolicyFile); err == nil {
			if err := json.Unmarshal(old, &policies); err != nil {
				return fmt.Errorf("read /%s of the parent image: %w", recipePolicyFile, err)
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for k, v := range c.Policies {
			policies[k] = v
		}
		data, err := json.MarshalIndent(policies, "", "  ")
		if err != nil {
			return err
		}
		if err := writeRoot(root, recipePolicyFile, append(data, '\n')); err != nil {
			return err
		}
	}
	if len(c.Flags) == 0 && len(c.Extensions) == 0 {
		return nil
	}
	var lines []string
	old, err := root.ReadFile(recipeFlagFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		lines = []string{"# Chromium flags from the image recipe's \"chromium\" section (one per line)"}
	case err != nil:
		return err
	default:
		lines = strings.Split(strings.TrimRight(string(old), "\n"), "\n")
	}
	// Chromium takes one --load-extension, a comma-separated list: a
	// second line would hide the parent's extensions, so the chain's
	// extensions are kept on one line, at the end.
	var exts []string
	kept := lines[:0]
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, loadExtension); ok {
			exts = append(exts, strings.Split(v, ",")...)
			continue
		}
		kept = append(kept, l)
	}
	lines = append(kept, c.Flags...)
	if exts = append(exts, c.Extensions...); len(exts) > 0 {
		lines = append(lines, loadExtension+strings.Join(exts, ","))
	}
	return writeRoot(root, recipeFlagFile, []byte(strings.Join(lines, "\n")+"\n"))
}

// loadExtension is Chromium's switch for unpacked extensions.
const loadExtension = "--load-extension="

// writeRoot replaces the file rel in root (0644, owned by root).
func writeRoot(root *os.Root, rel string, data []byte) error {
	if err := root.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
		return err
	}
	if err := root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := root.WriteFile(rel, data, 0o644); err != nil {
		return fmt.Errorf("write /%s: %w", rel, err)
	}
	return root.Chmod(rel, 0o644)
}

// imageUsers adds the users of the image's /etc/passwd to uids and homes,
// so a recipe with From may give its directories to a user of its parent.
func imageUsers(root *os.Root, uids map[string][2]int, homes map[string]string) error {
	data, err := root.ReadFile("etc/passwd")
	if err != nil {
		return fmt.Errorf("read the image's /etc/passwd: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 {
			continue
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		if _, ok := uids[f[0]]; !ok {
			uids[f[0]] = [2]int{uid, gid}
			homes[f[0]] = f[5]
		}
	}
	return sc.Err()
}
