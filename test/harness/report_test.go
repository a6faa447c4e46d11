package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSections(t *testing.T) {
	path := filepath.Join(t.TempDir(), "B.md")
	os.WriteFile(path, []byte("# Benchmarks\n\nbench text\n"), 0o644)
	if err := ReplaceSection(path, "soak", "## Soak\nrun 1"); err != nil {
		t.Fatal(err)
	}
	if err := ReplaceSection(path, "crash", "## Crash\n50 kills\n"); err != nil {
		t.Fatal(err)
	}
	if err := ReplaceSection(path, "soak", "## Soak\nrun 2\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	want := "# Benchmarks\n\nbench text\n\n<!-- begin soak -->\n## Soak\nrun 2\n<!-- end soak -->\n\n<!-- begin crash -->\n## Crash\n50 kills\n<!-- end crash -->\n"
	if string(b) != want {
		t.Fatalf("file:\n%q\nwant\n%q", b, want)
	}
	// What a rewrite (make bench) keeps.
	kept := Sections(path)
	if !strings.Contains(kept, "run 2") || !strings.Contains(kept, "50 kills") || strings.Contains(kept, "bench text") {
		t.Fatalf("Sections = %q", kept)
	}
	os.WriteFile(path, []byte("# New bench\n\n"+kept), 0o644)
	if Sections(path) != kept {
		t.Fatalf("sections not stable across a rewrite: %q", Sections(path))
	}
}
