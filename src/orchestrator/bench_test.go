package orchestrator

import (
	"fmt"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// BenchmarkReconcilePass is the CPU of one full pass over 100 groups and
// 10,000 queued jobs: ownership of every job (shared per listing) and each
// group's plan. Forge and CPI I/O are not included: they are the forge's
// and the CPI's time, bounded by timeouts.
func BenchmarkReconcilePass(b *testing.B) {
	const nGroups, nJobs = 100, 10000
	o := &Orchestrator{}
	fv := &forgeView{name: "f"}
	for i := 0; i < nGroups; i++ {
		labels := []string{fmt.Sprintf("pool-%d", i), "linux:host"}
		scope := forge.Scope{Kind: "org", Owner: fmt.Sprintf("org%d", i%10)}
		g := &group{scope: scope}
		g.setConf(config.GroupConfig{Name: fmt.Sprintf("g%d", i), Forge: "f", Labels: labels, MaxActiveRunners: 50,
			Timeouts: config.Timeouts{Idle: config.Duration{Duration: time.Hour}, MaxLifetime: config.Duration{Duration: time.Hour}}})
		o.groups = append(o.groups, g)
	}
	jobs := map[int64]forge.Job{}
	for i := 0; i < nJobs; i++ {
		jobs[int64(i+1)] = forge.Job{ID: int64(i + 1), Repo: fmt.Sprintf("org%d/repo%d", i%10, i%37),
			Labels: []string{fmt.Sprintf("pool-%d", i%nGroups), "linux"}, Status: forge.StatusQueued}
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		sj := &scopeJobs{jobs: jobs} // a fresh listing each pass
		l := o.partition(fv, sj)
		spawns := 0
		for _, g := range o.groups {
			c := g.cfg()
			d := plan(&c.GroupConfig, now, l, l.owned[c.Name], nil, nil, nil, false)
			spawns += len(d.spawn)
		}
		if spawns != nGroups*50 {
			b.Fatalf("%d spawns planned", spawns)
		}
	}
}
