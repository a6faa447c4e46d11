package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEtcdSecurity checks the etcd TLS and auth flags: what goes
// together, files that cannot be read or hold nothing, and what a good
// set gives the client.
func TestEtcdSecurity(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pass := write("pass", "s3cret\n")
	empty := write("empty", "\n")
	notPEM := write("ca.txt", "not a certificate")
	for _, tt := range []struct {
		name string
		f    clusterFlags
		want string // "" for no error
	}{
		{"nothing", clusterFlags{}, ""},
		{"user and password", clusterFlags{etcdUser: "cubicle", etcdPassFile: pass}, ""},
		{"user without password", clusterFlags{etcdUser: "cubicle"}, "go together"},
		{"password without user", clusterFlags{etcdPassFile: pass}, "go together"},
		{"empty password", clusterFlags{etcdUser: "cubicle", etcdPassFile: empty}, "is empty"},
		{"missing password file", clusterFlags{etcdUser: "cubicle", etcdPassFile: filepath.Join(dir, "nope")}, "--etcd-password-file"},
		{"cert without key", clusterFlags{etcdCert: pass}, "go together"},
		{"CA not PEM", clusterFlags{etcdCA: notPEM}, "no PEM certificate"},
		{"missing CA", clusterFlags{etcdCA: filepath.Join(dir, "nope")}, "--etcd-ca"},
		{"bad key pair", clusterFlags{etcdCert: notPEM, etcdKey: notPEM}, "--etcd-cert/--etcd-key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc, user, pw, err := etcdSecurity(tt.f)
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %v, want one saying %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc != nil {
				t.Errorf("TLS settings without TLS flags: %+v", tc)
			}
			if user != tt.f.etcdUser || (user != "" && pw != "s3cret") {
				t.Errorf("user %q, password %q", user, pw)
			}
		})
	}
}
