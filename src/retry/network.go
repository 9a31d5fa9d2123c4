package retry

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
)

// Misconfigured: the endpoint refuses connections or does not resolve — a
// wrong URL, not a hiccup worth waiting out.
func Misconfigured(err error) bool {
	var dnsErr *net.DNSError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &dnsErr) && dnsErr.IsNotFound
}

// Network classifies transport errors (no HTTP answer): a misconfigured
// endpoint is permanent; resets, broken pipes, truncated answers and
// request timeouts are transient. Anything else is permanent.
func Network(err error) Verdict {
	if Misconfigured(err) {
		return Verdict{Class: Permanent}
	}
	// A peer's reset can also surface as "use of closed network
	// connection" (net.ErrClosed): the transport's own reader saw the RST
	// first and closed the socket under the body read.
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset") {
		return Verdict{Class: Transient}
	}
	// A request timeout (http.Client.Timeout, "awaiting headers") wraps
	// context.DeadlineExceeded too: it is this request's, not the call's —
	// Do stops on the call's own context before asking.
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Verdict{Class: Transient}
	}
	return Verdict{Class: Permanent}
}
