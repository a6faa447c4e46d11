package filesystem

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// rawEvent encodes one struct inotify_event with name padded to pad bytes
// (the kernel pads to a multiple of 16 with NULs).
func rawEvent(wd int32, mask, cookie uint32, name string, pad int) []byte {
	b := make([]byte, inotifyHeader+pad)
	binary.NativeEndian.PutUint32(b[0:], uint32(wd))
	binary.NativeEndian.PutUint32(b[4:], mask)
	binary.NativeEndian.PutUint32(b[8:], cookie)
	binary.NativeEndian.PutUint32(b[12:], uint32(pad))
	copy(b[inotifyHeader:], name)
	return b
}

func TestParseInotify(t *testing.T) {
	for _, tt := range []struct {
		name    string
		buf     []byte
		want    []inotifyEvent
		wantErr error
	}{
		{"empty", nil, nil, nil},
		{
			"two events, one on the directory itself",
			slices.Concat(rawEvent(1, unix.IN_CREATE, 0, "a.txt", 16), rawEvent(2, unix.IN_DELETE_SELF, 0, "", 0)),
			[]inotifyEvent{{wd: 1, mask: unix.IN_CREATE, name: "a.txt"}, {wd: 2, mask: unix.IN_DELETE_SELF}},
			nil,
		},
		{
			"a name filling its padding, no NUL",
			rawEvent(3, unix.IN_MOVED_FROM, 7, "0123456789abcdef", 16),
			[]inotifyEvent{{wd: 3, mask: unix.IN_MOVED_FROM, cookie: 7, name: "0123456789abcdef"}},
			nil,
		},
		{"a short header", make([]byte, inotifyHeader-1), nil, errShortEvent},
		{"a name past the end", rawEvent(1, unix.IN_CREATE, 0, "x", 16)[:inotifyHeader+8], nil, errShortEvent},
		{"a huge name length", rawEvent(1, unix.IN_CREATE, 0, "", 0xffffffff)[:inotifyHeader], nil, errShortEvent},
		{"a slash in a name", rawEvent(1, unix.IN_CREATE, 0, "../etc", 16), nil, errBadName},
		{"dot-dot", rawEvent(1, unix.IN_CREATE, 0, "..", 16), nil, errBadName},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []inotifyEvent
			err := parseInotify(tt.buf, func(ev inotifyEvent) error { got = append(got, ev); return nil })
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr == nil && !slices.Equal(got, tt.want) {
				t.Errorf("events = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// FuzzParseInotify: no buffer panics the parser or yields a name that
// could leave the directory it was reported in.
func FuzzParseInotify(f *testing.F) {
	f.Add(slices.Concat(rawEvent(1, unix.IN_CREATE|unix.IN_ISDIR, 0, "sub", 16), rawEvent(1, unix.IN_MODIFY, 0, "f", 16)))
	f.Add(rawEvent(1, unix.IN_Q_OVERFLOW, 0, "", 0))
	f.Add(rawEvent(-1, unix.IN_IGNORED, 0, "", 0))
	f.Fuzz(func(t *testing.T, buf []byte) {
		n := 0
		err := parseInotify(buf, func(ev inotifyEvent) error {
			n++
			if ev.name == "." || ev.name == ".." || strings.ContainsAny(ev.name, "/\x00") {
				t.Fatalf("name %q passed", ev.name)
			}
			return nil
		})
		if err == nil && n*inotifyHeader > len(buf) {
			t.Fatalf("%d events from %d bytes", n, len(buf))
		}
	})
}

func TestIsUploadTemp(t *testing.T) {
	for _, tt := range []struct {
		name string
		want bool
	}{
		{".a.txt.cubicle-123456", true},
		{"..cubicle-1", true},
		{".a.txt.cubicle-", false},
		{".a.txt.cubicle-12x", false},
		{"a.txt.cubicle-123", false},
		{".cubicle-123", false},
		{"a.txt", false},
	} {
		if got := isUploadTemp(tt.name); got != tt.want {
			t.Errorf("isUploadTemp(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
