package orchestrator

import (
	"errors"
	"net/http"
	"sort"

	"github.com/runway-cpi/runway/src/forge"
)

// SignedBy returns the forge of forgeType whose webhook secret signed
// body ("" when none did).
func (o *Orchestrator) SignedBy(forgeType string, body []byte, h http.Header) string {
	forges := o.forgeMap()
	names := make([]string, 0, len(forges))
	for n := range forges {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if fv := forges[n]; fv.kind == forgeType {
			if cur := fv.cur.Load(); cur.client.VerifyDelivery([]byte(cur.secret()), body, h) {
				return n
			}
		}
	}
	return ""
}

// Webhook verifies and applies one workflow_job delivery for a forge
// type; it returns the forge that signed it. A delivery no configured
// secret verifies is rejected; one whose id was seen before is answered
// ErrDuplicate and not applied again.
func (o *Orchestrator) Webhook(forgeType, delivery string, body []byte, h http.Header) (string, forge.WorkflowJobEvent, error) {
	n := o.SignedBy(forgeType, body, h)
	if n == "" {
		return "", forge.WorkflowJobEvent{}, ErrBadSignature
	}
	if o.seenDelivery(forgeType, delivery) {
		return n, forge.WorkflowJobEvent{}, ErrDuplicate
	}
	ev, err := forge.ParseWorkflowJob(body)
	if err != nil {
		return n, ev, err
	}
	if fv := o.forgeMap()[n]; fv != nil {
		fv.apply(ev)
	}
	j := ev.Job
	j.Status = ev.Action
	o.observeJob(j)
	o.Kick(n, ev.Job.Repo)
	o.relay(relayed{Forge: n, Action: ev.Action, Job: &ev.Job})
	return n, ev, nil
}

// ErrBadSignature is a webhook delivery no secret verifies.
var ErrBadSignature = errors.New("webhook signature does not verify")

// ErrDuplicate is a webhook delivery whose id was seen before.
var ErrDuplicate = errors.New("webhook delivery seen before")

// maxDeliveries bounds the memory of deliveries seen.
const maxDeliveries = 4096

// seenDelivery records a delivery id (of a signed delivery: a forger must
// not burn the id of one yet to come) and reports whether it was seen
// before.
func (o *Orchestrator) seenDelivery(kind, id string) bool {
	if id == "" {
		return false
	}
	key := kind + "/" + id
	o.deliveryMu.Lock()
	defer o.deliveryMu.Unlock()
	if o.deliveries == nil {
		o.deliveries = map[string]bool{}
	}
	if o.deliveries[key] {
		return true
	}
	if len(o.deliveryOrder) >= maxDeliveries {
		delete(o.deliveries, o.deliveryOrder[0])
		o.deliveryOrder = o.deliveryOrder[1:]
	}
	o.deliveries[key] = true
	o.deliveryOrder = append(o.deliveryOrder, key)
	return false
}
