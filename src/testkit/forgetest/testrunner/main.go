// Command testrunner is the process a test runner VM runs: it reads what
// the orchestrator's bootstrap exported, registers with the forge's
// contract server, takes one job whose labels it has, completes it and
// exits — an ephemeral runner in miniature.
//
// Gitea: the Connect-RPC JSON runner protocol (Register, FetchTask,
// UpdateTask). Forgejo: the same protocol, connecting with the UUID and
// token its REST registration made (Declare instead of Register). GitHub: the contract server's stand-in endpoints, keyed by
// the JIT config.
//
// TESTRUNNER_HOLD_FILE: while that file exists, the job stays in progress.
// TESTRUNNER_STALL_FILE: if that file exists at start, the runner never
// registers (a boot that hangs) and waits until it is killed.
// TESTRUNNER_IDLE: how long to wait for a job before exiting (default 2m).
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/forgetest/gitearunner"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testrunner:", err)
		os.Exit(1)
	}
}

func run() error {
	if f := os.Getenv("TESTRUNNER_STALL_FILE"); f != "" {
		if _, err := os.Stat(f); err == nil {
			fmt.Println("stalled: never registering")
			// Block until killed; a bare select{} is a fatal deadlock
			// when the runtime has no other goroutine.
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			<-sig
			return nil
		}
	}
	idle := 2 * time.Minute
	if v := os.Getenv("TESTRUNNER_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		idle = d
	}
	if jit := os.Getenv("RUNWAY_RUNNER_JITCONFIG"); jit != "" {
		return github(jit, idle)
	}
	return gitea(idle)
}

// connect registers with the Gitea token, or connects as the runner
// Forgejo's REST API registered.
func connect() (*gitearunner.Runner, error) {
	labels := func(v string) []string { return forge.LabelNames(strings.Split(os.Getenv(v), ",")) }
	if uuid := os.Getenv("FORGEJO_RUNNER_UUID"); uuid != "" {
		return gitearunner.Connect(os.Getenv("FORGEJO_INSTANCE_URL"), uuid, os.Getenv("FORGEJO_RUNNER_TOKEN"),
			os.Getenv("FORGEJO_RUNNER_NAME"), labels("FORGEJO_RUNNER_LABELS"))
	}
	return gitearunner.Register(os.Getenv("GITEA_INSTANCE_URL"), os.Getenv("GITEA_RUNNER_REGISTRATION_TOKEN"),
		os.Getenv("GITEA_RUNNER_NAME"), labels("GITEA_RUNNER_LABELS"), os.Getenv("GITEA_RUNNER_EPHEMERAL") == "true")
}

func post(url string, hdr map[string]string, in, out any) (int, error) {
	b, _ := json.Marshal(in)
	req, err := http.NewRequest("POST", url, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("POST %s: HTTP %d: %s", url, resp.StatusCode, body)
	}
	if out != nil && len(body) > 0 {
		return resp.StatusCode, json.Unmarshal(body, out)
	}
	return resp.StatusCode, nil
}

// hold waits while the hold file exists, calling tick each second as a
// real runner reports its running job (Gitea: busy means active within
// the last 10 s).
func hold(tick func()) {
	f := os.Getenv("TESTRUNNER_HOLD_FILE")
	last := time.Now()
	for f != "" {
		if _, err := os.Stat(f); err != nil {
			return
		}
		if time.Since(last) >= time.Second {
			tick()
			last = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func gitea(idle time.Duration) error {
	r, err := connect()
	if err != nil {
		return err
	}
	fmt.Println("registered", r.Name)
	for deadline := time.Now().Add(idle); time.Now().Before(deadline); {
		id, err := r.FetchTask()
		if err != nil {
			return err
		}
		if id == "" {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		fmt.Println("took task", id)
		if err := r.Update(id, ""); err != nil {
			return err
		}
		hold(func() { r.Update(id, "") })
		err = r.Update(id, "RESULT_SUCCESS")
		fmt.Println("completed task", id)
		return err
	}
	fmt.Println("no job within", idle)
	return nil
}

func github(jit string, idle time.Duration) error {
	var cfg struct {
		URL      string `json:"url"`
		RunnerID int64  `json:"runner_id"`
		Secret   string `json:"secret"`
	}
	b, err := decodeJIT(jit)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("jit config: %v", err)
	}
	who := map[string]any{"runner_id": cfg.RunnerID, "secret": cfg.Secret}
	deadline := time.Now().Add(idle)
	for time.Now().Before(deadline) {
		var got struct {
			JobID int64 `json:"job_id"`
		}
		if _, err := post(cfg.URL+"/_runner/acquire", nil, who, &got); err != nil {
			return err
		}
		if got.JobID == 0 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		fmt.Println("took job", got.JobID)
		hold(func() {})
		_, err := post(cfg.URL+"/_runner/complete", nil, who, nil)
		return err
	}
	return nil
}

func decodeJIT(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("jit config is not base64: %v", err)
	}
	return b, nil
}
