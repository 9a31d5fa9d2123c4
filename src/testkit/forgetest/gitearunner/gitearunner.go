// Package gitearunner speaks the runner side of Gitea's Actions protocol
// (Connect-RPC, JSON bodies; Forgejo serves the same service) as
// gitea-runner does: Register with label
// names only, FetchTask sending back the tasks version last answered (0
// after a task, to look again), UpdateTask for progress and the result.
// The test runner program and tests that need a runner of their own use
// it against the contract server.
package gitearunner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Runner is one registered runner.
type Runner struct {
	Name        string
	UUID, Token string
	// TasksVersion is sent with FetchTask: the version last answered.
	TasksVersion string
	base         string
}

// StatusError is an RPC answered with a non-2xx status.
type StatusError struct {
	Method string
	Code   int
	Body   string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: HTTP %d: %s", e.Method, e.Code, e.Body)
}

// Register registers a runner at instanceURL with a registration token.
// labels are sent as given: pass them through forge.LabelNames first to
// do what gitea-runner does (it registers the names only).
func Register(instanceURL, token, name string, labels []string, ephemeral bool) (*Runner, error) {
	r := &Runner{Name: name, base: strings.TrimRight(instanceURL, "/") + "/api/actions/runner.v1.RunnerService/", TasksVersion: "0"}
	var reg struct {
		Runner struct {
			UUID  string `json:"uuid"`
			Token string `json:"token"`
		} `json:"runner"`
	}
	if err := r.call("Register", map[string]any{"name": name, "token": token, "version": "gitearunner",
		"labels": labels, "ephemeral": ephemeral}, &reg); err != nil {
		return nil, err
	}
	r.UUID, r.Token = reg.Runner.UUID, reg.Runner.Token
	return r, nil
}

// Connect is a runner registered elsewhere (Forgejo's REST registration
// hands out its UUID and token): it declares its labels, as
// forgejo-runner does when it starts.
func Connect(instanceURL, uuid, token, name string, labels []string) (*Runner, error) {
	r := &Runner{Name: name, UUID: uuid, Token: token, TasksVersion: "0",
		base: strings.TrimRight(instanceURL, "/") + "/api/actions/runner.v1.RunnerService/"}
	if err := r.call("Declare", map[string]any{"version": "gitearunner", "labels": labels}, nil); err != nil {
		return nil, err
	}
	return r, nil
}

// FetchTask asks for a task: its id, or "" when there is none.
func (r *Runner) FetchTask() (string, error) {
	var out struct {
		Task *struct {
			ID string `json:"id"`
		} `json:"task"`
		TasksVersion string `json:"tasksVersion"`
	}
	if err := r.call("FetchTask", map[string]any{"tasksVersion": r.TasksVersion}, &out); err != nil {
		return "", err
	}
	r.TasksVersion = out.TasksVersion
	if out.Task == nil {
		return "", nil
	}
	r.TasksVersion = "0" // gitea-runner: after a task, ask the database again
	return out.Task.ID, nil
}

// Update reports a task running (result "") or done ("RESULT_SUCCESS",
// "RESULT_FAILURE", ...).
func (r *Runner) Update(id, result string) error {
	state := map[string]any{"id": id}
	if result != "" {
		state["result"], state["stoppedAt"] = result, time.Now().UTC().Format(time.RFC3339)
	}
	return r.call("UpdateTask", map[string]any{"state": state}, nil)
}

func (r *Runner) call(method string, in, out any) error {
	b, _ := json.Marshal(in)
	req, err := http.NewRequest("POST", r.base+method, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if r.UUID != "" {
		req.Header.Set("x-runner-uuid", r.UUID)
		req.Header.Set("x-runner-token", r.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return &StatusError{Method: method, Code: resp.StatusCode, Body: string(body)}
	}
	if out != nil && len(body) > 0 {
		return json.Unmarshal(body, out)
	}
	return nil
}
