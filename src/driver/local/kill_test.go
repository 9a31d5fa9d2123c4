package local_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// cpiBin builds bin/cpi (with cpi-local) once for the tests that kill it.
func cpiBin() (string, error) { return cpibin.Path("local") }

type cpiEnv struct {
	t     *testing.T
	bin   string
	cfg   string
	state string
}

func newCPIEnv(t *testing.T) *cpiEnv {
	t.Helper()
	bin, err := cpiBin()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e := &cpiEnv{t: t, bin: bin, cfg: filepath.Join(dir, "cpi.json"), state: filepath.Join(dir, "state")}
	b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": e.state, "local": map[string]any{"stop_grace_seconds": 1}})
	if err := os.WriteFile(e.cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.killAll)
	return e
}

func (e *cpiEnv) cmd(method string, args ...any) *exec.Cmd {
	if args == nil {
		args = []any{}
	}
	req, _ := json.Marshal(map[string]any{"method": method, "arguments": args, "api_version": 2,
		"context": map[string]any{"director_uuid": "kill-test"}})
	c := exec.Command(e.bin, "-configPath", e.cfg)
	c.Env = []string{"PATH=/usr/bin:/bin"}
	c.Stdin = bytes.NewReader(req)
	return c
}

// call runs method to the end and answers result and error type.
func (e *cpiEnv) call(method string, args ...any) (json.RawMessage, string) {
	e.t.Helper()
	out, err := e.cmd(method, args...).Output()
	if err != nil {
		e.t.Fatalf("%s: %v", method, err)
	}
	var r struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		e.t.Fatalf("%s: %q", method, out)
	}
	if r.Error != nil {
		return nil, r.Error.Type + ": " + r.Error.Message
	}
	return r.Result, ""
}

// marked lists live processes that carry a VM marker and run under this
// environment's state dir, by VM CID.
func (e *cpiEnv) marked() map[string][]int {
	out := map[string][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		stat, _ := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || len(stat) < i+3 || stat[i+2] == 'Z' {
			continue
		}
		env, err := os.ReadFile("/proc/" + ent.Name() + "/environ")
		if err != nil || !bytes.Contains(env, []byte("RUNWAY_VM_DIR="+e.state+"/")) {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if cid, ok := strings.CutPrefix(string(kv), "RUNWAY_VM_CID="); ok {
				out[cid] = append(out[cid], pid)
			}
		}
	}
	return out
}

// orphans: processes whose VM no longer exists.
func (e *cpiEnv) orphans() map[string][]int {
	out := map[string][]int{}
	for cid, pids := range e.marked() {
		if _, err := os.Stat(filepath.Join(e.state, "vms", cid, "vm.json")); err != nil {
			out[cid] = pids
		}
	}
	return out
}

func (e *cpiEnv) killAll() {
	for _, pids := range e.marked() {
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

func (e *cpiEnv) leftovers() []string {
	var out []string
	for _, kind := range []string{"vms", "disks", "snapshots", "stemcells"} {
		entries, _ := os.ReadDir(filepath.Join(e.state, kind))
		for _, ent := range entries {
			if strings.HasPrefix(ent.Name(), ".") {
				out = append(out, kind+"/"+ent.Name())
			}
		}
	}
	return out
}

func (e *cpiEnv) stemcell() string {
	e.t.Helper()
	img := writeImage(e.t, map[string]string{"root.img": "x"})
	res, errType := e.call("create_stemcell", img, map[string]any{})
	if errType != "" {
		e.t.Fatal(errType)
	}
	var cid string
	json.Unmarshal(res, &cid)
	return cid
}

// vmsOf lists the VMs of an agent, as an orchestrator finds them.
func (e *cpiEnv) vmsOf(agent string) []string {
	res, errType := e.call("list_vms", map[string]string{"agent_id": agent})
	if errType != "" {
		e.t.Fatal(errType)
	}
	cids, err := cpibin.ListedCIDs(res)
	if err != nil {
		e.t.Fatal(err)
	}
	return cids
}

// create_vm is killed with SIGKILL at a random moment, or left running
// while delete_vm of its VM runs, 200 times; then every VM its agent has
// is deleted. No process of a deleted VM may survive, and nothing half
// made may remain once later calls have swept.
func TestKilledAndRacedCreatesLeaveNothing(t *testing.T) {
	e := newCPIEnv(t)
	sc := e.stemcell()
	trials := 200
	if testing.Short() {
		trials = 30
	}
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	for i := range trials {
		agent := fmt.Sprintf("agent-%d", i)
		create := e.cmd("create_vm", agent, sc, map[string]any{"command": "sleep 300"},
			map[string]any{"n": map[string]any{"type": "dynamic"}}, []string{}, map[string]any{})
		if err := create.Start(); err != nil {
			t.Fatal(err)
		}
		raced := rng.IntN(2) == 0
		// A random point in create_vm's ~5-20 ms: before, during or after
		// it publishes the VM and starts its process.
		time.Sleep(time.Duration(rng.IntN(20000)) * time.Microsecond)
		if raced {
			// delete_vm of whatever is listed while create_vm still runs.
			for _, vm := range e.vmsOf(agent) {
				e.call("delete_vm", vm)
			}
			create.Wait()
		} else {
			create.Process.Kill()
			create.Wait()
		}
		for _, vm := range e.vmsOf(agent) {
			if _, errType := e.call("delete_vm", vm); errType != "" && !strings.HasPrefix(errType, "Bosh::Clouds::VMNotFound") {
				t.Fatalf("trial %d: delete_vm %s: %s", i, vm, errType)
			}
		}
		if o := e.orphans(); len(o) > 0 {
			t.Fatalf("trial %d (raced=%v, seed %d): processes of deleted VMs still run: %v", i, raced, seed, o)
		}
	}
	// Later calls sweep what killed calls left, whatever its age.
	e.call("delete_stemcell", e.stemcell())
	vm, _ := e.call("create_vm", "agent-last", sc, map[string]any{}, map[string]any{}, []string{}, map[string]any{})
	var pair []string
	json.Unmarshal(vm, &pair)
	e.call("delete_vm", pair[0])
	if left := e.leftovers(); len(left) > 0 {
		t.Fatalf("left by killed calls: %v", left)
	}
	if m := e.marked(); len(m) > 0 {
		t.Fatalf("processes left: %v", m)
	}
}

// snapshot_disk, create_disk and create_stemcell killed mid-way leave
// .creating directories; the next call of the same kind removes them at
// once (their lock is free: the killed call is provably gone), while a
// call still in flight keeps its own.
func TestKilledCopiesAreSwept(t *testing.T) {
	e := newCPIEnv(t)
	res, _ := e.call("create_disk", 64, map[string]any{}, nil)
	var disk string
	json.Unmarshal(res, &disk)
	data := filepath.Join(e.state, "disks", disk, "data")
	big := bytes.Repeat([]byte("0123456789abcdef"), 4<<20) // 64 MiB: the copy takes a while
	for i := range 4 {
		os.WriteFile(filepath.Join(data, fmt.Sprintf("f%d", i)), big, 0o600)
	}
	for range 5 {
		c := e.cmd("snapshot_disk", disk, map[string]any{})
		c.Start()
		// Kill it once its copy is visible.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if m, _ := filepath.Glob(filepath.Join(e.state, "snapshots", ".creating-*", "data", "f*")); len(m) > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		c.Process.Kill()
		c.Wait()
	}
	if left := e.leftovers(); len(left) == 0 {
		t.Fatal("no half-made snapshot was left to sweep: the kill came too late")
	}
	snap, errType := e.call("snapshot_disk", disk, map[string]any{})
	if errType != "" {
		t.Fatal(errType)
	}
	var s string
	json.Unmarshal(snap, &s)
	e.call("delete_snapshot", s)
	if left := e.leftovers(); len(left) > 0 {
		t.Fatalf("after further snapshot calls: %v", left)
	}
}

// SIGTERM (the Director's and cpiclient's way to end a call past its
// timeout) ends a call blocked in a step within a second, with a typed
// error on stdout.
func TestSIGTERMEndsABlockedCall(t *testing.T) {
	e := newCPIEnv(t)
	// A 2 GiB image keeps create_stemcell busy unpacking.
	img := filepath.Join(t.TempDir(), "huge.tar")
	f, _ := os.Create(img)
	writeSparseTar(t, f, 2<<30)
	f.Close()
	c := e.cmd("create_stemcell", img, map[string]any{})
	var out bytes.Buffer
	c.Stdout = &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until it is unpacking.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m, _ := filepath.Glob(filepath.Join(e.state, "stemcells", ".creating-*", "image", "big")); len(m) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	c.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("bin/cpi exited with %v", err)
		}
	case <-time.After(5 * time.Second):
		c.Process.Kill()
		t.Fatal("bin/cpi still runs 5 s after SIGTERM")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("bin/cpi took %s to end after SIGTERM", took)
	}
	var r struct {
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.Error == nil || r.Error.Type != "Bosh::Clouds::CloudError" ||
		!strings.Contains(r.Error.Message, "SIGTERM") {
		t.Fatalf("response after SIGTERM: %q", out.String())
	}
	e.call("delete_stemcell", "sc-none") // sweeps the half-unpacked image
	if left := e.leftovers(); len(left) > 0 {
		t.Fatalf("left: %v", left)
	}
}

// writeSparseTar writes a tar with one file of size bytes of zeros,
// sparse on disk.
func writeSparseTar(t *testing.T, f *os.File, size int64) {
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	if err := tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	f.Write(hdr.Bytes())
	f.Truncate(int64(hdr.Len()) + size + 1024)
}
