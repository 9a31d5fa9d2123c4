package scaleset

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/runway-cpi/runway/src/forge"
)

// Job is the job as the orchestrator's forge.Job: its id is the job's
// Key (from its jobId, else its runner request id), its dates the
// messages' (queued, a runner assigned, finished).
func (j JobMessage) Job(status string) forge.Job {
	return forge.Job{ID: j.Key(), RunID: j.WorkflowRunID, Repo: j.Repo(), Name: j.DisplayName, Labels: j.Labels,
		Status: status, Conclusion: j.Result, RunnerName: j.RunnerName, CreatedAt: j.QueueTime.Time,
		StartedAt: j.RunnerAssignTime.Time, CompletedAt: j.FinishTime.Time}
}

// ScaleSetID is the scale set's id, found (or made) if the listener has
// not opened a session yet.
func (l *Listener) ScaleSetID(ctx context.Context) (int, error) {
	l.mu.Lock()
	id := l.st.ScaleSetID
	l.mu.Unlock()
	if id != 0 {
		return id, nil
	}
	set, err := l.cfg.Client.Ensure(ctx, l.Spec())
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	if l.st.ScaleSetID == 0 {
		l.st.ScaleSetID = set.ID
	}
	id = l.st.ScaleSetID
	l.mu.Unlock()
	return id, nil
}

// Forge is a group's forge.Client while its demand comes from a scale
// set: jobs as the listener knows them (never the REST job listing),
// runners registered from the scale set (JIT) and removed from it, the
// runner list still the REST API's (a scale set's runners are listed
// there).
type Forge struct {
	L *Listener
	// REST is the forge's current REST client (it may be replaced while
	// the group runs).
	REST func() forge.Client
}

// Jobs implements forge.Client: the jobs the scale set holds.
func (f *Forge) Jobs(context.Context, forge.Scope) ([]forge.Job, error) {
	st := f.L.State()
	out := make([]forge.Job, 0, len(st.Queued)+len(st.Running))
	for _, j := range st.Queued {
		out = append(out, j.Job(forge.StatusQueued))
	}
	for _, j := range st.Running {
		out = append(out, j.Job(forge.StatusInProgress))
	}
	return out, nil
}

// Job implements forge.Client from what the messages said. A job the
// listener does not know (started before a takeover or restart) is
// answered in progress with no runner: nothing is reaped on its account;
// the sweep finds its runner's end.
func (f *Forge) Job(_ context.Context, j forge.Job) (forge.Job, error) {
	if f.L.Completed(j.ID) {
		j.Status = forge.StatusCompleted
		return j, nil
	}
	st := f.L.State()
	if m, ok := st.Running[j.ID]; ok {
		return m.Job(forge.StatusInProgress), nil
	}
	if m, ok := st.Queued[j.ID]; ok {
		return m.Job(forge.StatusQueued), nil
	}
	j.Status, j.RunnerName = forge.StatusInProgress, ""
	return j, nil
}

// Register implements forge.Client: a JIT runner of the scale set.
func (f *Forge) Register(ctx context.Context, _ forge.Scope, name string, _ []string) (forge.Registration, error) {
	id, err := f.L.ScaleSetID(ctx)
	if err != nil {
		return forge.Registration{}, err
	}
	jit, err := f.L.cfg.Client.GenerateJIT(ctx, id, name)
	if err != nil {
		return forge.Registration{}, err
	}
	return forge.Registration{JITConfig: jit.Encoded, RunnerID: jit.Runner.ID}, nil
}

// Runners implements forge.Client: the REST API's list.
func (f *Forge) Runners(ctx context.Context, s forge.Scope) ([]forge.Runner, error) {
	return f.REST().Runners(ctx, s)
}

// DeleteRunner implements forge.Client through the Actions service; one
// running a job is forge.ErrRunnerBusy.
func (f *Forge) DeleteRunner(ctx context.Context, _ forge.Scope, id int64) error {
	return f.L.cfg.Client.RemoveRunner(ctx, id)
}

// DisableRunner implements forge.Client: scale set runners cannot be
// disabled.
func (f *Forge) DisableRunner(context.Context, forge.Scope, int64) (bool, error) { return false, nil }

// VerifyDelivery implements forge.Client: a scale set's group takes no
// webhook deliveries.
func (f *Forge) VerifyDelivery(_, _ []byte, _ http.Header) bool { return false }

// Spec is the scale set the listener keeps.
func (l *Listener) Spec() Spec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cfg.Spec
}

// SetSpec changes the scale set's labels (its name and runner group
// stay): set at the service now, and kept for every session opened
// after.
func (l *Listener) SetSpec(ctx context.Context, spec Spec) error {
	old := l.Spec()
	spec.Name, spec.RunnerGroupID = old.Name, old.RunnerGroupID
	if sameLabels(old.labels(), spec.Labels) {
		return nil
	}
	if _, err := l.cfg.Client.Ensure(ctx, spec); err != nil {
		return err // tried again at the next change or call
	}
	l.mu.Lock()
	l.cfg.Spec = spec
	l.mu.Unlock()
	return nil
}

// Check implements forge.Checker: the runner list the sweep reads, and
// the admin connection (a registration token of the scope exchanged at
// the Actions service), saying which token permission is missing when
// GitHub refuses. Nothing is made: the scale set is not looked for.
func (f *Forge) Check(ctx context.Context, s forge.Scope) error {
	var errs []error
	if _, err := f.REST().Runners(ctx, s); err != nil {
		errs = append(errs, fmt.Errorf("list runners: %w", err))
	}
	if _, _, err := f.L.cfg.Client.admin(ctx, false); err != nil {
		var e *Error
		if errors.As(err, &e) && (e.Status == 401 || e.Status == 403 || e.Status == 404) && strings.Contains(e.Op, "registration token") {
			err = fmt.Errorf("GitHub refuses a registration token for %s (HTTP %d: %s): the token needs admin:org (org) or repo (repo), or a fine-grained token's Self-hosted runners / Administration write", s, e.Status, e.Message)
		}
		errs = append(errs, fmt.Errorf("the scale sets' admin connection: %w", err))
	}
	return errors.Join(errs...)
}
