package kubernetes

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
)

// countingTransport counts the API requests a call makes.
type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// BenchmarkVMLifecycle: create_vm to Running and delete_vm until gone on
// the dev cluster's real kubelet, medians and API requests per method
// (docs/benchmarks.md). go test -run '^$' -bench VMLifecycle -benchtime 20x ./src/driver/kubernetes
func BenchmarkVMLifecycle(b *testing.B) {
	c := devCluster(b)
	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	ct := &countingTransport{}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { ct.next = rt; return ct })
	cs := k8s.NewForConfigOrDie(rc)
	lk, err := lock.New(filepath.Join(b.TempDir(), "locks"), time.Minute, logging.Discard())
	if err != nil {
		b.Fatal(err)
	}
	// The default grace period, and a process that ends on SIGTERM, as an
	// agent's or a runner's does (sleep as PID 1 ignores it: the whole
	// grace period would be measured).
	d, err := NewWithClient(c.section(map[string]any{"delete_grace_seconds": 10}), cs, lk, logging.Discard(), retry.Default())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	sc, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	props := driver.PropsOf(map[string]any{"command": "trap 'exit 0' TERM; sleep 3600 & wait", "ram": 64})
	var creates, deletes []time.Duration
	var createReqs, deleteReqs int64
	for b.Loop() {
		n0 := ct.n.Load()
		t0 := time.Now()
		vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "bench", StemcellCID: sc, CloudProps: props,
			Networks: driver.Networks{"default": {Type: "dynamic"}}, AgentSettings: []byte(`{}`)})
		if err != nil {
			b.Fatal(err)
		}
		creates = append(creates, time.Since(t0))
		n1 := ct.n.Load()
		t1 := time.Now()
		if err := d.DeleteVM(ctx, vm.CID); err != nil {
			b.Fatal(err)
		}
		deletes = append(deletes, time.Since(t1))
		createReqs += n1 - n0
		deleteReqs += ct.n.Load() - n1
	}
	n := float64(len(creates))
	b.ReportMetric(median(creates).Seconds(), "create-p50-s")
	b.ReportMetric(slices.Max(creates).Seconds(), "create-max-s")
	b.ReportMetric(median(deletes).Seconds(), "delete-p50-s")
	b.ReportMetric(slices.Max(deletes).Seconds(), "delete-max-s")
	b.ReportMetric(float64(createReqs)/n, "create-requests")
	b.ReportMetric(float64(deleteReqs)/n, "delete-requests")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
