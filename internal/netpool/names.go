package netpool

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
)

// Kinds of attachment.
const (
	// KindVeth: a network namespace whose eth0 is the guest end of a veth
	// pair; the host end is a port of the bridge. For OCI boxes, which join
	// the namespace.
	KindVeth = "veth"
	// KindTAP: a persistent TAP device in the daemon's namespace, a port of
	// the bridge, that the VMM opens by name (QEMU: -netdev
	// tap,ifname=NAME,script=no,downscript=no). The guest is told its
	// address, gateway and DNS on the kernel command line.
	KindTAP = "tap"
)

// Name prefixes of what the pool makes; everything is recognisable by them.
const (
	vethPrefix  = "cbv"
	tapPrefix   = "cbt"
	netnsPrefix = "cubicle-"
	guestIf     = "eth0"
	tableName   = "cubicle"
)

// hostIfName is the name of a sandbox's host-side device: a prefix and 10
// hex digits of a hash of the ID, because IFNAMSIZ allows 15 characters and
// IDs are longer.
func hostIfName(kind, id string) string {
	sum := sha256.Sum256([]byte(id))
	p := vethPrefix
	if kind == KindTAP {
		p = tapPrefix
	}
	return p + hex.EncodeToString(sum[:5])
}

// netnsName is the name of a sandbox's network namespace.
func netnsName(id string) string { return netnsPrefix + id }

// guestMAC is a stable, locally administered unicast MAC derived from id.
func guestMAC(id string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("mac:" + id))
	return net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}
}

// validID reports whether id can name a namespace, a chain and a state file.
func validID(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("netpool: invalid sandbox id %q", id)
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return fmt.Errorf("netpool: invalid sandbox id %q: want [a-z0-9]", id)
		}
	}
	return nil
}
