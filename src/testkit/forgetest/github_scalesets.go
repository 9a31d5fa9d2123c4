package forgetest

// The Actions service's scale sets: found, made, changed and deleted;
// and the knobs that set how the service behaves.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SetActionsFlow sets how the service hands scale sets their jobs
// (FlowGitHubCom unless set).
func (g *GitHub) SetActionsFlow(f ActionsFlow) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.actions.flow = f
}

// ActionsFlow is how the Actions service hands a scale set its jobs.
type ActionsFlow int

// SetCustomLabels turns a scale set's labels beyond its name on (the
// default) or off (GHES before 3.18, or without
// DistributedTask.AllowRunnerScaleSetCustomLabels: the name only, the
// rest dropped without a word).
func (g *GitHub) SetCustomLabels(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.actions.noCustomLabels = !on
}

// SetZeroCapacityAssigns sets whether, on github.com, a poll telling
// capacity 0 is still assigned jobs (default true).
func (g *GitHub) SetZeroCapacityAssigns(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.actions.zeroCapAssigns = on
}

// FailAcquire makes acquirejobs answer status (0: as the flow does).
func (g *GitHub) FailAcquire(status int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.actions.failAcquire = status
}

// RefuseAdminConnections answers the next n admin connections 401, as
// the service does a registration token it does not know yet.
func (g *GitHub) RefuseAdminConnections(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.actions.refuseAdmin = n
}

// SetAssignTimeout takes back a job assigned to a scale set that none of
// its runners took within d (0: never).
func (g *GitHub) SetAssignTimeout(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.actions.assignTimeout = d
}

// runnerGroups answers ?groupName= (only the Default group, id 1).
func (g *GitHub) runnerGroups(w http.ResponseWriter, r *http.Request) {
	out := []map[string]any{}
	if name := r.URL.Query().Get("groupName"); name == "" || strings.EqualFold(name, "default") {
		out = append(out, map[string]any{"id": 1, "name": "Default", "size": 0, "isDefaultGroup": true})
	}
	writeJSON(w, 200, map[string]any{"count": len(out), "value": out})
}

// effectiveLabels are the labels the service keeps for a set named
// name given these: its name first, then the others unless custom labels
// are off. The caller holds g.mu.
func (g *GitHub) effectiveLabels(name string, given []string) []string {
	out := []string{name}
	if g.actions.noCustomLabels {
		return out
	}
	for _, l := range given {
		if !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

func (g *GitHub) setJSON(s *ScaleSet) map[string]any {
	labels := []map[string]string{}
	for _, l := range s.Labels {
		labels = append(labels, map[string]string{"type": "System", "name": l})
	}
	return map[string]any{"id": s.ID, "name": s.Name, "runnerGroupId": s.RunnerGroupID, "runnerGroupName": "Default",
		"labels": labels, "RunnerSetting": map[string]any{"disableUpdate": true}, "statistics": g.statistics(s.ID),
		"runnerJitConfigUrl": fmt.Sprintf("%s%s/_apis/runtime/runnerscalesets/%d/generatejitconfig", g.URL, actionsPrefix, s.ID)}
}

// findScaleSet is GET runnerscalesets?runnerGroupId=&name=.
func (g *GitHub) findScaleSet(w http.ResponseWriter, r *http.Request, scope string) {
	q := r.URL.Query()
	group, _ := strconv.Atoi(q.Get("runnerGroupId"))
	g.mu.Lock()
	out := []map[string]any{}
	for id := 1; id <= g.actions.nextSet; id++ {
		s, ok := g.actions.sets[id]
		if ok && s.Scope == scope && s.Name == q.Get("name") && (group == 0 || s.RunnerGroupID == group) {
			out = append(out, g.setJSON(s))
		}
	}
	g.mu.Unlock()
	writeJSON(w, 200, map[string]any{"count": len(out), "value": out})
}

// setBody reads a scale set's name, runner group and labels.
func setBody(r *http.Request) (name string, group int, labels []string, err error) {
	var body struct {
		Name          string `json:"name"`
		RunnerGroupID int    `json:"runnerGroupId"`
		Labels        []struct {
			Name string `json:"name"`
		} `json:"labels"`
	}
	if err = json.NewDecoder(r.Body).Decode(&body); err != nil {
		return "", 0, nil, err
	}
	for _, l := range body.Labels {
		labels = append(labels, l.Name)
	}
	return body.Name, body.RunnerGroupID, labels, nil
}

// createScaleSet is POST runnerscalesets.
func (g *GitHub) createScaleSet(w http.ResponseWriter, r *http.Request, scope string) {
	name, group, labels, err := setBody(r)
	if err != nil || name == "" || len(labels) == 0 {
		actionsError(w, 400, "ArgumentException", "a scale set needs a name and labels")
		return
	}
	if group == 0 {
		group = 1
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.actions.sets {
		if s.Scope == scope && s.Name == name && s.RunnerGroupID == group {
			actionsError(w, 409, "RunnerScaleSetExistsException", "a scale set named "+name+" exists in this runner group")
			return
		}
	}
	g.actions.nextSet++
	s := &ScaleSet{ID: g.actions.nextSet, Name: name, RunnerGroupID: group, Labels: g.effectiveLabels(name, labels), Scope: scope}
	g.actions.sets[s.ID] = s
	g.actions.queues[s.ID] = &ssQueue{offered: map[int64]int64{}}
	writeJSON(w, 200, g.setJSON(s))
}

// setInScope is the scale set idText of scope, or nil once the 404 the
// service gives is written. g.mu is held.
func (g *GitHub) setInScope(w http.ResponseWriter, scope, idText string) *ScaleSet {
	id, _ := strconv.Atoi(idText)
	s, ok := g.actions.sets[id]
	if !ok || s.Scope != scope {
		actionsError(w, 404, "RunnerScaleSetNotFoundException", "no scale set "+idText)
		return nil
	}
	return s
}

// scaleSet is GET, PATCH (labels, runner group) and DELETE of one scale set.
func (g *GitHub) scaleSet(w http.ResponseWriter, r *http.Request, scope, idText string) {
	id, _ := strconv.Atoi(idText)
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.setInScope(w, scope, idText)
	if s == nil {
		return
	}
	switch r.Method {
	case "GET":
		writeJSON(w, 200, g.setJSON(s))
	case "PATCH":
		_, group, labels, err := setBody(r)
		if err != nil {
			actionsError(w, 400, "ArgumentException", err.Error())
			return
		}
		g.actions.stats.LabelPatches++
		if len(labels) > 0 {
			s.Labels = g.effectiveLabels(s.Name, labels)
		}
		if group != 0 {
			s.RunnerGroupID = group
		}
		writeJSON(w, 200, g.setJSON(s))
	case "DELETE":
		for _, rn := range g.runners {
			if rn.ScaleSet == id && rn.Job != 0 {
				actionsError(w, 400, "JobStillRunningException", "a runner of the scale set runs a job")
				return
			}
		}
		g.dropScaleSet(id)
		w.WriteHeader(204)
	default:
		actionsError(w, 405, "MethodNotAllowed", r.Method)
	}
}

// dropScaleSet removes a scale set, its session and runners; its jobs
// not started are queued again. The caller holds g.mu.
func (g *GitHub) dropScaleSet(id int) {
	delete(g.actions.sets, id)
	delete(g.actions.queues, id)
	if sess := g.actions.bySet[id]; sess != nil {
		delete(g.actions.sessions, sess.id)
		delete(g.actions.bySet, id)
	}
	for rid, rn := range g.runners {
		if rn.ScaleSet == id {
			delete(g.runners, rid)
		}
	}
	for _, j := range g.jobs {
		if j.ScaleSet == id && j.Status == "queued" {
			j.ScaleSet = 0
		}
	}
	g.actionsChanged()
}
