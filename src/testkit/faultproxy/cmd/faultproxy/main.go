// Command faultproxy runs the fault-injection proxy as a process, for
// suites that drive bin/cpi through it. It prints its URL on stdout and,
// when stopped (SIGTERM/SIGINT), its request and fault counts on stderr.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/runway-cpi/runway/src/testkit/faultproxy"
)

func main() {
	target := flag.String("target", "", "URL of the real API")
	dialect := flag.String("dialect", "aws", "error dialect: aws or openstack")
	rate := flag.Float64("rate", 0.2, "fraction of requests faulted")
	seed := flag.Uint64("seed", 1, "random seed")
	addr := flag.String("listen", "127.0.0.1:0", "listen address")
	flag.Parse()
	dialects := map[string]faultproxy.Dialect{"aws": faultproxy.AWS, "openstack": faultproxy.OpenStack}
	d, ok := dialects[*dialect]
	if !ok || *target == "" {
		fmt.Fprintln(os.Stderr, "usage: faultproxy -target URL [-dialect aws|openstack] [-rate 0.2] [-seed 1] [-listen 127.0.0.1:0]")
		os.Exit(2)
	}
	p, err := faultproxy.New(*target, d)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	kinds := []faultproxy.Fault{faultproxy.Throttle, faultproxy.ServerError, faultproxy.ResetBefore, faultproxy.ResetAfter}
	p.SetRule(faultproxy.Random(*rate, *seed, kinds...))
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("http://%s\n", ln.Addr())
	go http.Serve(ln, p)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	fmt.Fprintf(os.Stderr, "faultproxy: %d requests", p.Requests())
	for _, k := range kinds {
		fmt.Fprintf(os.Stderr, ", %s %d", k, p.Faults(k))
	}
	fmt.Fprintln(os.Stderr)
}
