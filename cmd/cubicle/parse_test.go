package main

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

func TestParseKV(t *testing.T) {
	tests := []struct {
		in      []string
		want    map[string]string
		wantErr bool
	}{
		{nil, nil, false},
		{[]string{"A=1"}, map[string]string{"A": "1"}, false},
		{[]string{"A=1", "B=x=y", "C="}, map[string]string{"A": "1", "B": "x=y", "C": ""}, false},
		{[]string{"A=1", "A=2"}, map[string]string{"A": "2"}, false},
		{[]string{"noequals"}, nil, true},
		{[]string{"=v"}, nil, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.in), func(t *testing.T) {
			got, err := parseKV(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseRegion(t *testing.T) {
	tests := []struct {
		in   string
		want *client.Region // nil: error
	}{
		{"0,0,100,50", &client.Region{X: 0, Y: 0, W: 100, H: 50}},
		{" 10, 20 ,30,40", &client.Region{X: 10, Y: 20, W: 30, H: 40}},
		{"1,2,3", nil},
		{"1,2,3,4,5", nil},
		{"a,2,3,4", nil},
		{"-1,0,10,10", nil},
		{"0,0,0,10", nil},
		{"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseRegion(tt.in)
			if tt.want == nil {
				if err == nil {
					t.Errorf("got %+v, want error", got)
				}
				return
			}
			if err != nil || *got != *tt.want {
				t.Errorf("got %+v, %v, want %+v", got, err, tt.want)
			}
		})
	}
}

func TestParseCopy(t *testing.T) {
	tests := []struct {
		src, dst string
		want     copySpec
		wantErr  bool
	}{
		{"./a.txt", "abc123:/root/a.txt", copySpec{upload, "abc123", "/root/a.txt", "./a.txt"}, false},
		{"-", "abc123:/tmp/x", copySpec{upload, "abc123", "/tmp/x", "-"}, false},
		{"abc123:/root/a.txt", ".", copySpec{download, "abc123", "/root/a.txt", "."}, false},
		{"abc123:/root/a.txt", "-", copySpec{download, "abc123", "/root/a.txt", "-"}, false},
		{"./we:ird", "abc:/x", copySpec{upload, "abc", "/x", "./we:ird"}, false},
		{"abc:/x", "def:/y", copySpec{}, true},
		{"a.txt", "b.txt", copySpec{}, true},
		{"a.txt", "abc:relative", copySpec{}, true},
		{"abc:relative", "a.txt", copySpec{}, true},
		{"ABC:/x", "a", copySpec{}, true}, // IDs are lower case
	}
	for _, tt := range tests {
		t.Run(tt.src+" "+tt.dst, func(t *testing.T) {
			got, err := parseCopy(tt.src, tt.dst)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParsePoints(t *testing.T) {
	got, err := parsePoints([]string{"1", "2", "3", "4", "5", "6"})
	want := []client.Point{{X: 1, Y: 2}, {X: 3, Y: 4}, {X: 5, Y: 6}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, %v, want %v", got, err, want)
	}
	for _, bad := range [][]string{{"1", "2"}, {"1", "2", "3"}, {"1", "2", "3", "x"}} {
		if _, err := parsePoints(bad); err == nil {
			t.Errorf("parsePoints(%v): want error", bad)
		}
	}
}

func TestParseEgress(t *testing.T) {
	tests := []struct {
		in      string
		want    *client.Network
		wantErr bool
	}{
		{"", nil, false},
		{"none", &client.Network{Egress: "none"}, false},
		{"all", &client.Network{Egress: "all"}, false},
		{"10.0.0.0/8", &client.Network{Allow: []string{"10.0.0.0/8"}}, false},
		{"10.0.0.0/8, 1.1.1.1", &client.Network{Allow: []string{"10.0.0.0/8", "1.1.1.1/32"}}, false},
		{"2001:db8::/32", &client.Network{Allow: []string{"2001:db8::/32"}}, false},
		{"some", nil, true},
		{",", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseEgress(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseSeconds(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"3600", 3600, false},
		{"0", 0, false},
		{"1h", 3600, false},
		{"90s", 90, false},
		{"1.5s", 2, false},
		{"-5", 0, true},
		{"-1m", 0, true},
		{"soon", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSeconds(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("got %d, %v, want %d (err %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestExecRequest(t *testing.T) {
	if got := execRequest([]string{"ls -la | wc -l"}); got.Command != "ls -la | wc -l" || got.Argv != nil {
		t.Errorf("single arg: %+v", got)
	}
	if got := execRequest([]string{"ls", "-la"}); got.Command != "" || !reflect.DeepEqual(got.Argv, []string{"ls", "-la"}) {
		t.Errorf("argv: %+v", got)
	}
}

func TestHumanDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{5 * time.Second, "5s"},
		{90 * time.Second, "1m"},
		{time.Hour, "1h"},
		{3*time.Hour + 5*time.Minute, "3h5m"},
		{50 * time.Hour, "2d2h"},
		{-time.Minute, "1m"},
	}
	for _, tt := range tests {
		if got := humanDuration(tt.d); got != tt.want {
			t.Errorf("humanDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestFormatError(t *testing.T) {
	idx := 2
	tests := []struct {
		err  error
		want string
	}{
		{&client.APIError{Status: 404, Code: "not_found", Message: "sandbox x not found"}, "error: sandbox x not found (not_found)"},
		{fmt.Errorf("wrapped: %w", &client.APIError{Status: 400, Code: "invalid_argument", Message: "bad key", Index: &idx}), "error: action 2: bad key (invalid_argument)"},
		{&client.APIError{Status: 502, Code: "internal"}, "error: Bad Gateway (internal)"},
		{errors.New("dial tcp: refused"), "error: dial tcp: refused"},
	}
	for _, tt := range tests {
		if got := formatError(tt.err); got != tt.want {
			t.Errorf("formatError(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
