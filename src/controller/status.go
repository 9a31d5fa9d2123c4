package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"errors"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

const mergePatch = types.MergePatchType

var metav1PatchOptions = metav1.PatchOptions{FieldManager: "runway"}

// ReasonEngineError: the engine's last pass for the group failed (its
// error is the message).
const ReasonEngineError = "ReconcileFailed"

// lastCheckEvery bounds how often a moving lastCheckTime alone is
// written (every pass moves it).
const lastCheckEvery = 10 * time.Second

// writeStatus writes the object's status when it changed: the engine's
// counts, observedGeneration and the Ready condition.
func (c *Controller) writeStatus(ctx context.Context, key string, e *entry, u *unstructured.Unstructured) error {
	var st GroupState
	known := false
	if e.group != nil {
		st, known = c.opt.Engine.State(e.group.Name)
	}
	cond := c.readiness(e, st, known)
	var existing struct {
		Status struct {
			Conditions []metav1.Condition `json:"conditions"`
		} `json:"status"`
	}
	_ = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &existing)
	conds := existing.Status.Conditions
	meta.SetStatusCondition(&conds, cond)
	status := map[string]any{"observedGeneration": e.generation, "conditions": conds}
	if e.kind != kindForge {
		status["activeRunners"] = st.ActiveRunners
		status["queuedJobs"] = st.QueuedJobs
		if e.kind == kindGroup {
			status["idle"], status["busy"] = st.Idle, st.Busy
		}
		if !st.LastCheckTime.IsZero() {
			status["lastCheckTime"] = metav1.NewTime(st.LastCheckTime).Rfc3339Copy()
		}
	}
	fp := fmt.Sprint(e.generation, st.ActiveRunners, st.QueuedJobs, st.Idle, st.Busy, cond.Status, cond.Reason, cond.Message)
	now := time.Now()
	c.mu.Lock()
	same := fp == e.written && (st.LastCheckTime.IsZero() || now.Sub(e.writtenAt) < lastCheckEvery)
	c.mu.Unlock()
	if same {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	if _, err := c.opt.Dyn.Resource(gvrs[e.kind]).Namespace(e.ns).Patch(ctx, e.name, mergePatch, patch, metav1PatchOptions, "status"); err != nil {
		return fmt.Errorf("writing the status of %s: %w", key, err)
	}
	c.mu.Lock()
	e.written, e.writtenAt = fp, now
	c.mu.Unlock()
	return nil
}

// readiness is the Ready condition: why the object is not ready, or
// that it is.
func (c *Controller) readiness(e *entry, st GroupState, known bool) metav1.Condition {
	no := func(reason, msg string) metav1.Condition {
		return metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: reason, Message: c.opt.Redactor.Redact(msg),
			ObservedGeneration: e.generation}
	}
	switch {
	case e.deleting:
		return no(ReasonDeleting, fmt.Sprintf("removing the group's %d runners, their pods and their registrations", st.ActiveRunners))
	case e.bad != nil:
		return no(e.bad.reason, e.bad.msg)
	case e.kind == kindForge:
		return metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: ReasonReady, Message: "its Secrets are there",
			ObservedGeneration: e.generation}
	case e.checkErr != nil && errors.Is(e.checkErr, ErrTokenScope):
		return no(ReasonTokenScopeMissing, e.checkErr.Error())
	case e.checkErr != nil:
		return no(ReasonForgeUnreachable, e.checkErr.Error())
	case known && st.LastError != "":
		return no(ReasonEngineError, st.LastError)
	case known && st.NotTakingJobs > 0:
		return no(ReasonNotTakingJobs, fmt.Sprintf("%d runners registered and took none of the %d jobs queued for the group's labels "+
			"(the RunnerNotTakingJobs events name them): it makes no more while they are there — check what its runner registers",
			st.NotTakingJobs, st.QueuedJobs))
	case known && st.SpawnsHeldUntil.After(time.Now()):
		return no(ReasonNotTakingJobs, fmt.Sprintf("its last runners registered and took none of the jobs queued for the group's labels: "+
			"it makes no runner until %s", st.SpawnsHeldUntil.UTC().Format(time.RFC3339)))
	}
	return metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: ReasonReady,
		Message: "runners are made for the queued jobs it claims", ObservedGeneration: e.generation}
}
