package desktop

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

func TestParseDisplay(t *testing.T) {
	t.Setenv("DISPLAY", ":7")
	for _, tt := range []struct {
		in   string
		want displayAddr
	}{
		{"", displayAddr{"unix", "/tmp/.X11-unix/X7", "", "7"}},
		{":1", displayAddr{"unix", "/tmp/.X11-unix/X1", "", "1"}},
		{":1.0", displayAddr{"unix", "/tmp/.X11-unix/X1", "", "1"}},
		{"unix:2", displayAddr{"unix", "/tmp/.X11-unix/X2", "", "2"}},
		{"/tmp/launch-1/org.x:0", displayAddr{"unix", "/tmp/launch-1/org.x:0", "", "0"}},
		{"example.com:3.1", displayAddr{"tcp", "example.com:6003", "example.com", "3"}},
		{"tcp/10.0.0.1:0", displayAddr{"tcp", "10.0.0.1:6000", "10.0.0.1", "0"}},
	} {
		got, err := parseDisplay(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("parseDisplay(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"nocolon", ":", ":x", ":-1"} {
		if _, err := parseDisplay(bad); err == nil {
			t.Errorf("parseDisplay(%q) succeeded", bad)
		}
	}
}

func TestReadAuthority(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	var file []byte
	entry := func(family uint16, fields ...string) {
		file = binary.BigEndian.AppendUint16(file, family)
		for _, f := range fields {
			file = binary.BigEndian.AppendUint16(file, uint16(len(f)))
			file = append(file, f...)
		}
	}
	cookie := func(b byte) string { return string(make([]byte, 15)) + string(rune(b)) }
	entry(256, "otherhost", "1", "MIT-MAGIC-COOKIE-1", cookie(1))
	entry(256, host, "2", "MIT-MAGIC-COOKIE-1", cookie(2))
	entry(256, host, "1", "MIT-MAGIC-COOKIE-1", cookie(3))
	entry(65535, "", "", "MIT-MAGIC-COOKIE-1", cookie(4))
	path := filepath.Join(t.TempDir(), "Xauthority")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XAUTHORITY", path)
	for _, tt := range []struct {
		host, number string
		want         byte
	}{
		{"", "1", 3},
		{"localhost", "1", 3},
		{"", "9", 4}, // the wildcard entry
		{"otherhost", "1", 1},
	} {
		name, data, err := readAuthority(tt.host, tt.number)
		if err != nil || name != "MIT-MAGIC-COOKIE-1" || len(data) != 16 || data[15] != tt.want {
			t.Errorf("readAuthority(%q, %q) = %q, %v, %v; want cookie %d", tt.host, tt.number, name, data, err, tt.want)
		}
	}
	t.Setenv("XAUTHORITY", filepath.Join(t.TempDir(), "missing"))
	if _, _, err := readAuthority("", "1"); err == nil {
		t.Error("readAuthority with no file succeeded")
	}
}

// TestInputConnection checks that Open gives input a connection of its own,
// and that closing the desktop closes it.
func TestInputConnection(t *testing.T) {
	d, _ := openDesktop(t)
	in, ok := d.in.(*xinput)
	if !ok {
		t.Fatalf("input goes through %T, want *xinput", d.in)
	}
	if err := d.sync(); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := in.sync(); err == nil {
		t.Error("sync on the closed input connection succeeded")
	}
}

// The pointer and keyboard tests again, with input through the main xgb
// connection as when the input connection cannot be opened.

func useXGBInput(t *testing.T) {
	inputViaXGB = true
	t.Cleanup(func() { inputViaXGB = false })
}

func TestPointerXGBInput(t *testing.T) {
	useXGBInput(t)
	TestPointer(t)
}

func TestKeyboardXGBInput(t *testing.T) {
	useXGBInput(t)
	TestKeyboard(t)
}
