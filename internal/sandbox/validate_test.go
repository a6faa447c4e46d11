package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// manyPairs returns n distinct key/value pairs, keys K0, K1, ...
func manyPairs(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("K%d", i)] = "v"
	}
	return m
}

func manyCIDRs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	return out
}

func TestValidateCreate(t *testing.T) {
	for _, tt := range []struct {
		name string
		req  CreateRequest
		want CreateRequest // when valid; zero = req unchanged
		err  string        // the whole message; "" = valid
	}{
		{name: "all defaults", req: CreateRequest{}},
		{name: "everything set", req: CreateRequest{Template: "desktop", Backend: "gvisor", Resolution: Resolution{Width: 1280, Height: 800},
			DPI: 96, VCPUs: 2, MemoryMB: 2048, TimeoutSeconds: 3600, IdleTimeoutSeconds: 1800, StartURL: "https://example.org/x?y=1",
			Env: map[string]string{"K": "V", "_a1": ""}, Metadata: map[string]string{"k": "v"}, Network: Network{Egress: "none"}, Owner: "key-1"}},
		{name: "lowest bounds", req: CreateRequest{Resolution: Resolution{Width: MinWidth, Height: MinHeight}, DPI: MinDPI, VCPUs: MinVCPUs, MemoryMB: MinMemoryMB}},
		{name: "highest bounds", req: CreateRequest{Resolution: Resolution{Width: MaxWidth, Height: MaxHeight}, DPI: MaxDPI, VCPUs: MaxVCPUs, MemoryMB: MaxMemoryMB,
			TimeoutSeconds: MaxTimeoutSeconds, IdleTimeoutSeconds: MaxTimeoutSeconds, StartURL: "http://h/" + strings.Repeat("a", MaxStartURLBytes-9),
			Env: manyPairs(MaxEnvVars), Metadata: map[string]string{strings.Repeat("k", MaxMetadataKeyBytes): strings.Repeat("v", MaxMetadataValueBytes)},
			Network: Network{Allow: manyCIDRs(MaxAllowCIDRs)}}},
		{name: "template name characters", req: CreateRequest{Template: "my-image_2.1"}},
		{name: "about and file URLs", req: CreateRequest{StartURL: "about:blank"}},
		{name: "file URL", req: CreateRequest{StartURL: "file:///tmp/x.html"}},
		{name: "egress all", req: CreateRequest{Network: Network{Egress: "all"}}},
		{name: "allow-list is masked", req: CreateRequest{Network: Network{Allow: []string{"10.1.2.3/8", " 192.168.1.7/24 ", "1.2.3.4", "2001:db8::1/32", "::1"}}},
			want: CreateRequest{Network: Network{Allow: []string{"10.0.0.0/8", "192.168.1.0/24", "1.2.3.4/32", "2001:db8::/32", "::1/128"}}}},

		{name: "template path", req: CreateRequest{Template: "../etc"}, err: `template "../etc" is not a valid template name`},
		{name: "template upper case", req: CreateRequest{Template: "Desktop"}, err: `template "Desktop" is not a valid template name`},
		{name: "template too long", req: CreateRequest{Template: strings.Repeat("a", MaxTemplateName+1)}, err: `template "` + strings.Repeat("a", MaxTemplateName) + `…" is not a valid template name`},
		{name: "backend", req: CreateRequest{Backend: "docker"}, err: `backend must be firecracker, qemu, gvisor or runc, not "docker"`},
		{name: "backend auto is the daemon's word, not a request's", req: CreateRequest{Backend: "auto"}, err: `backend must be firecracker, qemu, gvisor or runc, not "auto"`},
		{name: "width low", req: CreateRequest{Resolution: Resolution{Width: MinWidth - 1, Height: 768}}, err: "resolution 319x768 is out of range 320..7680 x 200..4320"},
		{name: "height high", req: CreateRequest{Resolution: Resolution{Width: 1024, Height: MaxHeight + 1}}, err: "resolution 1024x4321 is out of range 320..7680 x 200..4320"},
		{name: "half a resolution", req: CreateRequest{Resolution: Resolution{Width: 1024}}, err: "resolution 1024x0 is out of range 320..7680 x 200..4320"},
		{name: "dpi low", req: CreateRequest{DPI: MinDPI - 1}, err: "dpi must be 50..600, not 49"},
		{name: "dpi high", req: CreateRequest{DPI: MaxDPI + 1}, err: "dpi must be 50..600, not 601"},
		{name: "vcpus high", req: CreateRequest{VCPUs: MaxVCPUs + 1}, err: "vcpus must be 1..64, not 65"},
		{name: "vcpus negative", req: CreateRequest{VCPUs: -1}, err: "vcpus must be 1..64, not -1"},
		{name: "memory low", req: CreateRequest{MemoryMB: MinMemoryMB - 1}, err: "memory_mb must be 256..262144, not 255"},
		{name: "memory high", req: CreateRequest{MemoryMB: MaxMemoryMB + 1}, err: "memory_mb must be 256..262144, not 262145"},
		{name: "timeout negative", req: CreateRequest{TimeoutSeconds: -1}, err: "timeout_seconds must be 0..31622400, not -1"},
		{name: "timeout past a year", req: CreateRequest{TimeoutSeconds: MaxTimeoutSeconds + 1}, err: "timeout_seconds must be 0..31622400, not 31622401"},
		{name: "idle negative", req: CreateRequest{IdleTimeoutSeconds: -5}, err: "idle_timeout_seconds must be 0..31622400, not -5"},
		{name: "idle past a year", req: CreateRequest{IdleTimeoutSeconds: MaxTimeoutSeconds + 1}, err: "idle_timeout_seconds must be 0..31622400, not 31622401"},
		{name: "start_url javascript", req: CreateRequest{StartURL: "javascript:alert(1)"}, err: "start_url must be an http, https, about or file URL"},
		{name: "start_url data", req: CreateRequest{StartURL: "data:text/html,x"}, err: "start_url must be an http, https, about or file URL"},
		{name: "start_url relative", req: CreateRequest{StartURL: "example.org"}, err: "start_url must be an http, https, about or file URL"},
		{name: "start_url without host", req: CreateRequest{StartURL: "http:///x"}, err: `start_url "http:///x" has no host`},
		{name: "start_url with a space", req: CreateRequest{StartURL: "https://example.org/a b"}, err: "start_url is not a valid URL"},
		{name: "start_url too long", req: CreateRequest{StartURL: "http://h/" + strings.Repeat("a", MaxStartURLBytes-8)}, err: "start_url is longer than 8192 bytes"},
		{name: "env too many", req: CreateRequest{Env: manyPairs(MaxEnvVars + 1)}, err: "env has 257 variables (at most 256)"},
		{name: "env name with a digit first", req: CreateRequest{Env: map[string]string{"1A": "x"}}, err: `env: "1A" is not a valid variable name (letters, digits and _, not starting with a digit)`},
		{name: "env name with =", req: CreateRequest{Env: map[string]string{"A=B": "x"}}, err: `env: "A=B" is not a valid variable name (letters, digits and _, not starting with a digit)`},
		{name: "env name empty", req: CreateRequest{Env: map[string]string{"": "x"}}, err: `env: "" is not a valid variable name (letters, digits and _, not starting with a digit)`},
		{name: "env name too long", req: CreateRequest{Env: map[string]string{strings.Repeat("A", MaxEnvKeyBytes+1): "x"}}, err: `env: "` + strings.Repeat("A", 64) + `…" is not a valid variable name (letters, digits and _, not starting with a digit)`},
		{name: "env value too long", req: CreateRequest{Env: map[string]string{"A": strings.Repeat("v", MaxEnvValueBytes+1)}}, err: "env: the value of A is longer than 32768 bytes"},
		{name: "env value with NUL", req: CreateRequest{Env: map[string]string{"A": "x\x00y"}}, err: "env: the value of A contains a NUL byte"},
		{name: "metadata too many", req: CreateRequest{Metadata: manyPairs(MaxMetadataPairs + 1)}, err: "metadata has 65 keys (at most 64)"},
		{name: "metadata key empty", req: CreateRequest{Metadata: map[string]string{"": "v"}}, err: `metadata: "" is not a valid key (1..128 printable bytes)`},
		{name: "metadata key control", req: CreateRequest{Metadata: map[string]string{"a\nb": "v"}}, err: `metadata: "a\nb" is not a valid key (1..128 printable bytes)`},
		{name: "metadata key too long", req: CreateRequest{Metadata: map[string]string{strings.Repeat("k", MaxMetadataKeyBytes+1): "v"}}, err: `metadata: "` + strings.Repeat("k", 64) + `…" is not a valid key (1..128 printable bytes)`},
		{name: "metadata value too long", req: CreateRequest{Metadata: map[string]string{"k": strings.Repeat("v", MaxMetadataValueBytes+1)}}, err: `metadata: the value of "k" is longer than 1024 bytes`},
		{name: "metadata value not UTF-8", req: CreateRequest{Metadata: map[string]string{"k": "a\xffb"}}, err: `metadata: the value of "k" is not valid UTF-8`},
		{name: "egress mode", req: CreateRequest{Network: Network{Egress: "some"}}, err: `network.egress must be "none", "all" or {"allow": [CIDR, ...]}, not "some"`},
		{name: "egress mode and a list", req: CreateRequest{Network: Network{Egress: "none", Allow: []string{"10.0.0.0/8"}}}, err: `network.egress is either "none", "all" or an allow-list, not "none" with one`},
		{name: "allow-list too long", req: CreateRequest{Network: Network{Allow: manyCIDRs(MaxAllowCIDRs + 1)}}, err: "network.egress.allow has 257 entries (at most 256)"},
		{name: "allow entry a domain", req: CreateRequest{Network: Network{Allow: []string{"10.0.0.0/8", "example.com"}}}, err: `network.egress.allow[1]: "example.com" is not an IP address or CIDR (cubicle filters egress by address, not by domain name)`},
		{name: "allow entry bad prefix", req: CreateRequest{Network: Network{Allow: []string{"10.0.0.0/33"}}}, err: `network.egress.allow[0]: "10.0.0.0/33" is not an IP address or CIDR (cubicle filters egress by address, not by domain name)`},
		{name: "allow entry with a zone", req: CreateRequest{Network: Network{Allow: []string{"fe80::1%eth0"}}}, err: `network.egress.allow[0]: "fe80::1%eth0" is not an IP address or CIDR (cubicle filters egress by address, not by domain name)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ValidateCreate(tt.req)
			if tt.err != "" {
				var fe *FieldError
				if !errors.As(err, &fe) || !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("error %#v, want a *FieldError that is ErrInvalid", err)
				}
				if err.Error() != tt.err {
					t.Errorf("message\n %q\nwant\n %q", err.Error(), tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("error %v", err)
			}
			want := tt.want
			if cmp.Equal(want, CreateRequest{}) {
				want = tt.req
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
		})
	}
}

func TestCheckTimeoutAndEnv(t *testing.T) {
	for _, tt := range []struct {
		seconds int
		ok      bool
	}{{0, true}, {1, true}, {MaxTimeoutSeconds, true}, {-1, false}, {MaxTimeoutSeconds + 1, false}} {
		if err := CheckTimeout("timeout_seconds", tt.seconds); (err == nil) != tt.ok {
			t.Errorf("CheckTimeout(%d) = %v, want ok %v", tt.seconds, err, tt.ok)
		}
	}
	if err := CheckEnv(map[string]string{"PATH": "/bin", "_": ""}); err != nil {
		t.Errorf("CheckEnv of a good env: %v", err)
	}
	if err := CheckEnv(map[string]string{"A B": "x"}); err == nil || !strings.HasPrefix(err.Error(), "env: ") {
		t.Errorf("CheckEnv of a bad name: %v", err)
	}
}

func FuzzValidateCreate(f *testing.F) {
	f.Add("desktop", "gvisor", 1024, 768, 96, 2, 2048, 60, 0, "https://example.org", "K", "v", "k", "v", "", "10.0.0.0/8")
	f.Add("", "", 0, 0, 0, 0, 0, 0, 0, "", "", "", "", "", "none", "")
	f.Add("../x", "docker", 1, 1, 1, 100, 1, -1, -1, "javascript:x", "1A", "\x00", "", "\xff", "some", "example.com")
	f.Fuzz(func(t *testing.T, tmpl, backend string, w, h, dpi, vcpus, mem, timeout, idle int,
		startURL, envK, envV, mdK, mdV, egress, allow string) {
		req := CreateRequest{Template: tmpl, Backend: backend, Resolution: Resolution{Width: w, Height: h},
			DPI: dpi, VCPUs: vcpus, MemoryMB: mem, TimeoutSeconds: timeout, IdleTimeoutSeconds: idle, StartURL: startURL,
			Env: map[string]string{envK: envV}, Metadata: map[string]string{mdK: mdV}, Network: Network{Egress: egress}}
		if allow != "" {
			req.Network.Allow = strings.Split(allow, ",")
		}
		got, err := ValidateCreate(req)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" || !strings.HasPrefix(err.Error(), fe.Field) {
				t.Fatalf("error %#v is not a FieldError naming its field", err)
			}
			return
		}
		// Accepted once, accepted again unchanged: normalizing is stable.
		again, err := ValidateCreate(got)
		if err != nil || !cmp.Equal(again, got) {
			t.Fatalf("ValidateCreate(%+v) = %+v, then %+v, %v", req, got, again, err)
		}
		if got.TimeoutSeconds < 0 || got.TimeoutSeconds > MaxTimeoutSeconds || got.VCPUs < 0 || got.VCPUs > MaxVCPUs {
			t.Fatalf("accepted %+v", got)
		}
	})
}
