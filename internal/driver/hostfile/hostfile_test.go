package hostfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadPid(t *testing.T) {
	tests := []struct {
		content string
		want    int
		wantErr bool
	}{
		{"1234\n", 1234, false},
		{" 7 ", 7, false},
		{"0", 0, true},
		{"-3", 0, true},
		{"abc", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		p := filepath.Join(t.TempDir(), "pid")
		os.WriteFile(p, []byte(tt.content), 0o600)
		got, err := ReadPid(p)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("ReadPid(%q) = %d, %v; want %d, error %v", tt.content, got, err, tt.want, tt.wantErr)
		}
	}
	if _, err := ReadPid(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("ReadPid of a missing file: no error")
	}
}

func TestTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	var b strings.Builder
	for i := 0; i < 10000; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	os.WriteFile(p, []byte(b.String()), 0o600)
	if got, want := Tail(p, 2), "console.log:\nline 9998\nline 9999"; got != want {
		t.Errorf("Tail = %q, want %q", got, want)
	}
	if got := Tail(filepath.Join(t.TempDir(), "missing"), 3); got != "" {
		t.Errorf("Tail of a missing file = %q, want empty", got)
	}
}
