// Package netprefix reads the prefix length the Director gives a network
// (one address, or a delegated prefix) and refuses a delegated prefix on
// a driver that gives a network one address.
package netprefix

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/runway-cpi/runway/src/driver"
)

// Bits reads the prefix length the Director sends as a string
// ("32") or a number; ok is false when there is none.
func Bits(n driver.Network) (bits int, ok bool, err error) {
	t := strings.TrimSpace(string(n.Prefix))
	if t == "" {
		return 0, false, nil
	}
	bits, err = strconv.Atoi(t)
	if err != nil || bits < 0 || bits > 128 {
		return 0, false, fmt.Errorf("prefix %q is not a prefix length", t)
	}
	return bits, true, nil
}

// OneAddress reports whether the network's prefix names a single address
// (none given, or the address's full length: 32 for IPv4, 128 for IPv6 —
// either, on a network with no ip yet), as the official AWS CPI reads it.
func OneAddress(n driver.Network) (bool, error) {
	bits, ok, err := Bits(n)
	if err != nil || !ok {
		return err == nil, err
	}
	if ip := net.ParseIP(n.IP); ip != nil && n.IP != "" {
		if ip.To4() != nil {
			return bits == 32, nil
		}
		return bits == 128, nil
	}
	return bits == 32 || bits == 128, nil
}

// CheckNoDelegation refuses a delegated prefix, by name, on a driver that
// gives a network one address; a single-address prefix is accepted.
func CheckNoDelegation(n driver.Network, name, driverName string) error {
	one, err := OneAddress(n)
	if err != nil {
		return driver.Invalid("networks.%s.%v", name, err)
	}
	if !one {
		return fmt.Errorf("%w: networks.%s.prefix %s (prefix delegation) is not supported by the %s driver: a network gets one address", driver.ErrNotSupported, name, n.Prefix, driverName)
	}
	return nil
}
