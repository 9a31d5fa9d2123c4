package hostnet

import (
	"net/netip"
	"testing"
)

func TestUsableAddresses(t *testing.T) {
	b := &Bridge{Prefix: netip.MustParsePrefix("10.250.0.0/22")}
	for ip, ok := range map[string]bool{"10.250.1.77": true, "10.250.0.2": true, "10.250.3.254": true,
		"10.250.0.0": false, "10.250.0.1": false, "10.250.3.255": false, "10.251.0.5": false, "192.168.0.1": false} {
		if err := b.usable(netip.MustParseAddr(ip)); (err == nil) != ok {
			t.Errorf("%s: usable=%v, err %v", ip, ok, err)
		}
	}
}
