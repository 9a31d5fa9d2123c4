package orchestrator

import (
	"fmt"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// maxPickupHold bounds how long a group whose runners take no job makes
// no new one.
const maxPickupHold = time.Hour

// checkPickup acts on a plan's runners that register and take none of
// the group's queued jobs (their labels, their image or the forge do not
// let them: for any forge, whatever the reason): each is reported once
// (a log line and an event), the count is the group's status and a
// gauge, and the group makes no runner while they are there nor for a
// hold after they are gone, doubling each time it happens again (from
// timeouts.pickup up to an hour). A runner taking a job resets it.
func (g *group) checkPickup(d *decision, now time.Time) {
	c := g.cfg()
	var fresh []store.Runner
	g.mu.Lock()
	if len(d.busy) > 0 {
		g.pickupHold, g.stuck, g.holdUntil = 0, false, time.Time{}
	}
	switch {
	case len(d.notTaking) == 0:
		g.stuck = false
	case !g.stuck: // it happens (again)
		g.pickupHold = min(max(2*g.pickupHold, c.Timeouts.Pickup.Duration), maxPickupHold)
		g.stuck = true
	}
	if len(d.notTaking) > 0 {
		g.holdUntil = now.Add(g.pickupHold)
		if g.reported == nil {
			g.reported = map[string]bool{}
		}
		for _, r := range d.notTaking {
			if !g.reported[r.Name] {
				g.reported[r.Name] = true
				fresh = append(fresh, r)
			}
		}
	}
	held := now.Before(g.holdUntil)
	g.status.NotTakingJobs, g.status.SpawnsHeldUntil = len(d.notTaking), time.Time{}
	if held {
		g.status.SpawnsHeldUntil = g.holdUntil
	}
	hold := g.pickupHold
	g.mu.Unlock()
	if held {
		d.spawn = nil
	}
	g.dep.metrics.notTaking.WithLabelValues(c.Name).Set(float64(len(d.notTaking)))
	for _, r := range fresh {
		msg := fmt.Sprintf("online since %s with labels %s, it took none of the %d jobs queued for them: "+
			"the group makes no runner while it is there, nor for %s after", r.OnlineAt.UTC().Format(time.RFC3339),
			strings.Join(forge.LabelNames(c.Labels), ","), d.queued, hold)
		g.dep.log.Warn("a runner takes no job", "group", c.Name, "runner", r.Name, "detail", msg)
		g.dep.event(c.Name, r.Name, RunnerNotTaking, msg)
	}
}
