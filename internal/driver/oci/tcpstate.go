package oci

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// tcpConn is one TCP endpoint of a /proc/net/tcp{,6} table.
type tcpConn struct {
	Local, Remote netip.AddrPort
	State         string // as ss names it: ESTAB, TIME-WAIT, …
}

// tcpStates names the st column of /proc/net/tcp (include/net/tcp_states.h).
var tcpStates = map[uint64]string{
	1: "ESTAB", 2: "SYN-SENT", 3: "SYN-RECV", 4: "FIN-WAIT-1", 5: "FIN-WAIT-2", 6: "TIME-WAIT",
	7: "CLOSE", 8: "CLOSE-WAIT", 9: "LAST-ACK", 10: "LISTEN", 11: "CLOSING",
}

// connectedTCP parses /proc/net/tcp and /proc/net/tcp6 tables (any
// number, one after the other, header lines included) and returns the
// endpoints that are neither listening nor closed: those runsc 20221219
// refuses to checkpoint ("endpoint cannot be saved in connected state").
// Lines it cannot read are errors: a table it misreads must not let a
// checkpoint that will fail, and stop the box, go ahead.
func connectedTCP(tables string) ([]tcpConn, error) {
	var out []tcpConn
	for _, line := range strings.Split(tables, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "sl" {
			continue
		}
		if len(f) < 4 || !strings.HasSuffix(f[0], ":") {
			return nil, fmt.Errorf("tcp table: unexpected line %q", truncate(line, 80))
		}
		st, err := strconv.ParseUint(f[3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("tcp table: state %q: %w", f[3], err)
		}
		if st == 10 || st == 7 {
			continue
		}
		local, err := procAddr(f[1])
		if err != nil {
			return nil, err
		}
		remote, err := procAddr(f[2])
		if err != nil {
			return nil, err
		}
		name := tcpStates[st]
		if name == "" {
			name = "state " + f[3]
		}
		out = append(out, tcpConn{Local: local, Remote: remote, State: name})
	}
	return out, nil
}

// procAddr parses ADDR:PORT of /proc/net/tcp: the address in hex, in
// 32-bit words of host (little-endian) byte order; the port in hex.
func procAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("tcp table: address %q", truncate(s, 64))
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("tcp table: address %q", truncate(s, 64))
	}
	for i := 0; i < len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("tcp table: port %q", truncate(p, 16))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
