package scaleset

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// ScaleSet is a runner scale set as the service spells it.
type ScaleSet struct {
	ID              int           `json:"id,omitempty"`
	Name            string        `json:"name,omitempty"`
	RunnerGroupID   int           `json:"runnerGroupId,omitempty"`
	RunnerGroupName string        `json:"runnerGroupName,omitempty"`
	Labels          []Label       `json:"labels,omitempty"`
	RunnerSetting   RunnerSetting `json:"RunnerSetting"`
	Statistics      *Statistics   `json:"statistics,omitempty"`
	// Missing are the labels asked for that the service did not keep
	// (GHES before 3.18, or custom labels off: the name only).
	Missing []string `json:"-"`
}

// Label is one of a scale set's labels (type "System" as ARC makes
// them).
type Label struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

// RunnerSetting: the runner does not update itself (Runway's image is
// what it is).
type RunnerSetting struct {
	DisableUpdate bool `json:"disableUpdate,omitempty"`
}

// Statistics are the scale set's counts as the service reports them
// with the session and every message: the demand.
type Statistics struct {
	TotalAvailableJobs     int `json:"totalAvailableJobs"`
	TotalAcquiredJobs      int `json:"totalAcquiredJobs"`
	TotalAssignedJobs      int `json:"totalAssignedJobs"`
	TotalRunningJobs       int `json:"totalRunningJobs"`
	TotalRegisteredRunners int `json:"totalRegisteredRunners"`
	TotalBusyRunners       int `json:"totalBusyRunners"`
	TotalIdleRunners       int `json:"totalIdleRunners"`
}

// valid: no count is negative, running jobs are assigned ones.
func (s *Statistics) valid() bool {
	return s != nil && s.TotalAvailableJobs >= 0 && s.TotalAcquiredJobs >= 0 && s.TotalAssignedJobs >= 0 &&
		s.TotalRunningJobs >= 0 && s.TotalRegisteredRunners >= 0 && s.TotalBusyRunners >= 0 && s.TotalIdleRunners >= 0
}

// list is the service's collection answer.
type list[T any] struct {
	Count int `json:"count"`
	Value []T `json:"value"`
}

// Spec is the scale set a group wants: its name within a runner group,
// and its labels (what jobs' runs-on name).
type Spec struct {
	Name          string
	RunnerGroupID int
	Labels        []string
}

// labels are spec's labels as the service takes them.
func (s Spec) labels() []Label {
	out := make([]Label, 0, len(s.Labels))
	for _, l := range s.Labels {
		out = append(out, Label{Type: "System", Name: l})
	}
	return out
}

func sameLabels(a []Label, b []string) bool {
	names := make([]string, 0, len(a))
	for _, l := range a {
		names = append(names, l.Name)
	}
	slices.Sort(names)
	b = slices.Sorted(slices.Values(b))
	return slices.Equal(slices.Compact(names), slices.Compact(b))
}

// kept are the labels the service holds for spec: its labels and its
// name, which the service always adds (actions/scaleset's README: the
// name "also serves as the label").
func (s Spec) kept() []string { return append([]string{s.Name}, s.Labels...) }

// missing are spec's labels the set does not hold.
func missing(set ScaleSet, spec Spec) []string {
	var out []string
	for _, l := range spec.Labels {
		if !slices.ContainsFunc(set.Labels, func(h Label) bool { return h.Name == l }) {
			out = append(out, l)
		}
	}
	return out
}

// Ensure finds the scale set by runner group and name, makes it if there
// is none, and sets its labels when they differ from spec's (its name
// among them). A PATCH whose answer still lacks some (the service drops
// them) is not sent again for that spec: the set comes back with those
// labels in Missing. It answers the scale set as the service holds it.
func (c *Client) Ensure(ctx context.Context, spec Spec) (ScaleSet, error) {
	if spec.Name == "" || len(spec.Labels) == 0 {
		return ScaleSet{}, errors.New("scale sets: a scale set needs a name and labels")
	}
	q := url.Values{"runnerGroupId": {strconv.Itoa(spec.RunnerGroupID)}, "name": {spec.Name}}
	var found list[ScaleSet]
	if err := c.service(ctx, "GET", scaleSetsPath+"?"+q.Encode(), nil, &found, "finding scale set "+spec.Name); err != nil {
		return ScaleSet{}, err
	}
	want := ScaleSet{Name: spec.Name, RunnerGroupID: spec.RunnerGroupID, Labels: spec.labels(), RunnerSetting: RunnerSetting{DisableUpdate: true}}
	switch {
	case found.Count > 1 || len(found.Value) > 1:
		return ScaleSet{}, &Error{Op: "finding scale set " + spec.Name, Message: "more than one scale set has that name"}
	case found.Count == 0 || len(found.Value) == 0:
		var made ScaleSet
		if err := c.service(ctx, "POST", scaleSetsPath, want, &made, "making scale set "+spec.Name); err != nil {
			return ScaleSet{}, err
		}
		made.Missing = missing(made, spec)
		c.noteLabels(made.ID, spec, made.Missing)
		return made, checkSet(made, "making scale set "+spec.Name)
	}
	have := found.Value[0]
	if err := checkSet(have, "finding scale set "+spec.Name); err != nil {
		return ScaleSet{}, err
	}
	have.Missing = missing(have, spec)
	if sameLabels(have.Labels, spec.kept()) || c.refusedBefore(have.ID, spec) {
		return have, nil
	}
	var updated ScaleSet
	op := fmt.Sprintf("setting the labels of scale set %d", have.ID)
	if err := c.service(ctx, "PATCH", fmt.Sprintf("%s/%d", scaleSetsPath, have.ID), want, &updated, op); err != nil {
		return ScaleSet{}, err
	}
	updated.Missing = missing(updated, spec)
	c.noteLabels(updated.ID, spec, updated.Missing)
	return updated, checkSet(updated, op)
}

// noteLabels remembers that the service dropped some of spec's labels
// on set id (nothing dropped: forgets it).
func (c *Client) noteLabels(id int, spec Spec, dropped []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(dropped) == 0 {
		delete(c.dropped, id)
		return
	}
	c.dropped[id] = strings.Join(slices.Sorted(slices.Values(spec.Labels)), ",")
}

// refusedBefore: the service dropped these very labels on set id before.
func (c *Client) refusedBefore(id int, spec Spec) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped[id] == strings.Join(slices.Sorted(slices.Values(spec.Labels)), ",")
}

func checkSet(s ScaleSet, op string) error {
	if s.ID <= 0 {
		return &Error{Op: op, Message: "the answer names no scale set id"}
	}
	return nil
}

// Get reads a scale set by id (forge.ErrNotFound once it is deleted).
func (c *Client) Get(ctx context.Context, id int) (ScaleSet, error) {
	var s ScaleSet
	err := c.service(ctx, "GET", fmt.Sprintf("%s/%d", scaleSetsPath, id), nil, &s, fmt.Sprintf("scale set %d", id))
	return s, err
}

// Delete removes a scale set (its runners must be gone: the service
// refuses while a runner of it runs a job).
func (c *Client) Delete(ctx context.Context, id int) error {
	err := c.service(ctx, "DELETE", fmt.Sprintf("%s/%d", scaleSetsPath, id), nil, nil, fmt.Sprintf("deleting scale set %d", id))
	if errors.Is(err, forge.ErrNotFound) {
		return nil
	}
	return err
}

// RunnerRef is a runner as the service names it.
type RunnerRef struct {
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	ScaleSetID int    `json:"runnerScaleSetId"`
}

// JIT is a just-in-time runner config: the runner exists (offline) from
// now on, and its encoded config (a secret) is all it needs to start.
type JIT struct {
	Runner  RunnerRef `json:"runner"`
	Encoded string    `json:"encodedJITConfig"`
}

// agentsPath is the runners' collection (every scale set's).
const agentsPath = "_apis/distributedtask/pools/0/agents"

// GenerateJIT registers runner name in scale set id and answers its JIT
// config. A name already registered in this scale set (a spawn retried
// after a crash) is removed and registered anew, as ARC does; one of
// another scale set is an error.
func (c *Client) GenerateJIT(ctx context.Context, id int, name string) (JIT, error) {
	body := map[string]string{"name": name, "workFolder": "_work"}
	op := "a JIT config for runner " + name
	for attempt := 0; ; attempt++ {
		var j JIT
		err := c.service(ctx, "POST", fmt.Sprintf("%s/%d/generatejitconfig", scaleSetsPath, id), body, &j, op)
		if err == nil {
			if j.Encoded == "" || j.Runner.ID <= 0 {
				return JIT{}, &Error{Op: op, Message: "the answer lacks the runner id or the config"}
			}
			return j, nil
		}
		if attempt > 0 || !errors.Is(err, ErrRunnerExists) {
			return JIT{}, err
		}
		old, ferr := c.RunnerByName(ctx, name)
		if ferr != nil {
			return JIT{}, errors.Join(err, ferr)
		}
		if old.ID == 0 || old.ScaleSetID != id {
			return JIT{}, fmt.Errorf("%w (and it is not this scale set's)", err)
		}
		if rerr := c.RemoveRunner(ctx, old.ID); rerr != nil {
			return JIT{}, errors.Join(err, rerr)
		}
	}
}

// RunnerByName finds a runner (ID 0: none).
func (c *Client) RunnerByName(ctx context.Context, name string) (RunnerRef, error) {
	var l list[RunnerRef]
	if err := c.service(ctx, "GET", agentsPath+"?"+url.Values{"agentName": {name}}.Encode(), nil, &l, "finding runner "+name); err != nil {
		return RunnerRef{}, err
	}
	switch {
	case len(l.Value) == 0:
		return RunnerRef{}, nil
	case len(l.Value) > 1:
		return RunnerRef{}, &Error{Op: "finding runner " + name, Message: "more than one runner has that name"}
	}
	return l.Value[0], nil
}

// RemoveRunner removes a runner's registration; a missing one is not an
// error. One running a job is refused (ErrJobStillRunning).
func (c *Client) RemoveRunner(ctx context.Context, id int64) error {
	err := c.service(ctx, "DELETE", fmt.Sprintf("%s/%d", agentsPath, id), nil, nil, fmt.Sprintf("removing runner %d", id))
	if errors.Is(err, forge.ErrNotFound) {
		return nil
	}
	return err
}

// AdminExpiry is when the current admin token expires (zero: none yet).
func (c *Client) AdminExpiry() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.adminExp
}
