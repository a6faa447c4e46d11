package account

import (
	"encoding/base64"
	"os"
	"testing"
)

func basic(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }

func TestUserFromBasicAuth(t *testing.T) {
	tests := []struct {
		header  string
		want    string
		wantErr bool
	}{
		{"", "", false},
		{basic("user:"), "user", false},
		{basic("root:secret"), "root", false},
		{basic("nobody"), "nobody", false},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("a_b-c.d:")), "a_b-c.d", false},
		{basic(":"), "", true},
		{basic("../etc:"), "", true},
		{basic("a b:"), "", true},
		{basic("-rf:"), "", true},
		{"Bearer xyz", "", true},
		{"Basic !!!", "", true},
		{"Basic", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			got, err := UserFromBasicAuth(tt.header)
			if (err != nil) != tt.wantErr {
				t.Fatalf("UserFromBasicAuth(%q) err = %v, wantErr %v", tt.header, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("UserFromBasicAuth(%q) = %q, want %q", tt.header, got, tt.want)
			}
		})
	}
}

func FuzzUserFromBasicAuth(f *testing.F) {
	f.Add(basic("user:"))
	f.Add("Basic " + "dXNlcjo=")
	f.Add("Basic \x00")
	f.Fuzz(func(t *testing.T, header string) {
		name, err := UserFromBasicAuth(header)
		if err != nil {
			return
		}
		if header != "" && !validName(name) {
			t.Fatalf("accepted invalid name %q", name)
		}
	})
}

func TestLookup(t *testing.T) {
	a, err := Lookup("root")
	if err != nil {
		t.Fatal(err)
	}
	if a.UID != 0 || a.Home != "/root" {
		t.Errorf("root = %+v", a)
	}
	if _, err := Lookup("no-such-user-xyz"); err == nil {
		t.Error("Lookup(no-such-user-xyz) succeeded")
	}
	if os.Getuid() == 0 && a.Credential() != nil {
		t.Error("root credential as root should be nil")
	}
}
