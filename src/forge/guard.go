package forge

import (
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// GuardedTransport is http.DefaultTransport's equal whose every
// connection's address is put to check first — after the name was
// resolved, so a name that later resolves to a refused address is
// refused too (a redirect included) — and that uses no proxy (a proxy's
// address would be checked instead of the forge's).
func GuardedTransport(check func(netip.Addr) error) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			a, err := netip.ParseAddr(host)
			if err != nil {
				return err
			}
			return check(a.Unmap())
		}}
	t.DialContext = d.DialContext
	return t
}
