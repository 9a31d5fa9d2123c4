package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver/local/console"
	"github.com/runway-cpi/runway/src/driver/local/hostnet"
	"github.com/runway-cpi/runway/src/driver/local/mountsvc"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/record"
)

// A container VM is watched by a supervisor: the driver's own executable
// started again, detached, with superviseEnv naming the VM's directory
// (the pattern of containerd's shims and conmon). It is the child
// subreaper of the container's init, so it learns its exit status; it
// reads the cgroup's OOM counter before the runtime removes it, writes
// both where process-mode VMs have them (exit_status, console.log), and
// forwards SIGTERM to the VM. It carries the VM's marker, so delete_vm
// finds it like a process-mode VM's processes.
//
// The driver's executable calls Supervised first thing in its main.
const superviseEnv = "RUNWAY_SUPERVISE_VM"

// Served is a running VM as its mount service's handler needs it: its
// directory, the state dir's locks, its init's pid and its cgroups.
type Served struct {
	Dir, Locks, Cgroup string
	InitPID            int
}

// Mounts answers one of a VM's mount requests (package mountsvc).
type Mounts func(ctx context.Context, vm Served, peer unix.Ucred, req mountsvc.Request) error

// Prepare makes a VM's file systems, in the supervisor's own mount
// namespace, before its container is made: they are the VM's alone, and
// the host's mount table (which every runtime create copies) does not
// grow with the VMs.
type Prepare func(dir string) error

// Supervised runs the supervisor when this process was started as one,
// and exits; otherwise it returns at once.
func Supervised(prepare Prepare, mounts Mounts) {
	if dir := os.Getenv(superviseEnv); dir != "" {
		os.Exit(supervise(dir, prepare, mounts))
	}
}

// superviseSpec is vms/<cid>/supervise.json.
type superviseSpec struct {
	CID         string       `json:"cid"`
	ID          string       `json:"id"`
	Runtime     string       `json:"runtime"`
	RuntimeRoot string       `json:"runtime_root"`
	Cgroup      string       `json:"cgroup"`
	RAM         int          `json:"ram,omitempty"`
	ConsoleMax  int64        `json:"console_max"`
	Net         hostnet.Plan `json:"net"`
	MountSocket string       `json:"mount_socket,omitempty"`
	MountUID    uint32       `json:"mount_uid,omitempty"`
	Locks       string       `json:"locks,omitempty"`
}

// Start is one container VM to start: its directory (vms/<cid>, where
// the bundle, console and exit status are), the runtime's names for it,
// its memory limit (for an OOM message) and its network.
type Start struct {
	CID, Dir, ID, Cgroup string
	Runtime              Runtime
	RAM                  int
	// ConsoleMax caps console.log (bytes).
	ConsoleMax int64
	Net        hostnet.Plan
	// MountSocket: where the VM's mount service listens (the host's path
	// of DisksDir/mountsvc.SocketName), when its stemcell's agent mounts
	// its disks itself; MountUID: the VM's root as the host sees it, the
	// only user it serves; Locks: the state dir's locks.
	MountSocket, Locks string
	MountUID           uint32
}

// Run starts the VM's supervisor and returns once the VM runs (or failed
// to start: then nothing of it runs).
func (st Start) Run(ctx context.Context) error {
	spec := superviseSpec{CID: st.CID, ID: st.ID, Runtime: st.Runtime.Path, RuntimeRoot: st.Runtime.Root,
		Cgroup: st.Cgroup, RAM: st.RAM, ConsoleMax: st.ConsoleMax, Net: st.Net, MountSocket: st.MountSocket, MountUID: st.MountUID, Locks: st.Locks}
	if err := record.Write(filepath.Join(st.Dir, "supervise.json"), spec); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	goR, goW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer goW.Close()
	resR, resW, err := os.Pipe()
	if err != nil {
		goR.Close()
		return err
	}
	defer resR.Close()
	cmd := exec.Command(self)
	cmd.Dir = st.Dir
	cmd.Env = []string{superviseEnv + "=" + st.Dir, procs.EnvMarker + "=" + st.CID, "PATH=" + procs.VMPath}
	cmd.ExtraFiles = []*os.File{goR, resW}
	// As the process-mode wrapper: a bin/cpi killed before the go-ahead
	// takes the supervisor with it (it clears this once it has it).
	// A mount namespace of its own (Go makes its / private: nothing
	// mounted in it reaches the host's).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL, Unshareflags: syscall.CLONE_NEWNS}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err = cmd.Start()
	goR.Close()
	resW.Close()
	if err != nil {
		return fmt.Errorf("starting the vm's supervisor: %w", err)
	}
	go func() { _ = cmd.Wait() }() // reaped here when bin/cpi lives on
	if err := record.WriteFile(filepath.Join(st.Dir, "pgid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n")); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		return fmt.Errorf("recording the vm's supervisor: %w", err)
	}
	if _, err := goW.Write([]byte{'g'}); err != nil {
		return fmt.Errorf("starting the vm's supervisor: %w", err)
	}
	type answer struct {
		b   []byte
		err error
	}
	ch := make(chan answer, 1)
	go func() { b, err := io.ReadAll(resR); ch <- answer{b, err} }()
	select {
	case a := <-ch:
		msg := strings.TrimSpace(string(a.b))
		if msg == "ok" {
			return nil
		}
		if msg == "" {
			msg = "the supervisor exited without an answer"
		}
		return errors.New(msg)
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		return ctx.Err()
	}
}

// supervise is the supervisor's main: fd 3 carries the go-ahead, fd 4 the
// answer ("ok" once the VM runs, else the error).
func supervise(dir string, prepare Prepare, mounts Mounts) int {
	// The main thread stays this goroutine's: work done on a thread of
	// its own in another root or namespace (storage.OnOwnThread) never
	// lands on it, so /proc/<supervisor>/root stays the host's.
	runtime.LockOSThread()
	goR, res := os.NewFile(3, "go"), os.NewFile(4, "answer")
	fail := func(err error) int {
		fmt.Fprintln(res, err)
		res.Close()
		return 1
	}
	if b := make([]byte, 1); func() bool { n, _ := goR.Read(b); return n != 1 }() {
		return 1 // bin/cpi died before the VM was recorded
	}
	goR.Close()
	_ = unix.Prctl(unix.PR_SET_PDEATHSIG, 0, 0, 0, 0)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail(fmt.Errorf("supervisor: %w", err))
	}
	var s superviseSpec
	if err := record.Read(filepath.Join(dir, "supervise.json"), &s); err != nil {
		return fail(fmt.Errorf("supervisor: %w", err))
	}
	if _, err := os.Stat(filepath.Join(dir, "vm.json")); err != nil {
		return fail(errors.New("the vm was deleted before it started"))
	}
	if prepare != nil {
		if err := prepare(dir); err != nil {
			return fail(err)
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	children.Lock()
	children.supervising = true
	children.Unlock()
	log, err := console.Open(filepath.Join(dir, "console.log"), s.ConsoleMax)
	if err != nil {
		return fail(fmt.Errorf("supervisor: %w", err))
	}
	defer log.Close()
	v := supervised{dir: dir, spec: s, console: log, drained: make(chan struct{})}
	pid, err := v.start(sigs)
	if err != nil {
		return fail(err)
	}
	stopMounts, err := v.serveMounts(pid, mounts)
	if err != nil {
		_ = v.rt("delete", "--force", s.ID)
		return fail(err)
	}
	defer stopMounts()
	fmt.Fprintln(res, "ok")
	res.Close()
	go func() {
		for range sigs {
			_ = v.rt("kill", s.ID, "TERM")
		}
	}()
	v.finish(waitExit(pid))
	return 0
}

// serveMounts listens for the VM's mount requests while it runs, when
// its stemcell asks for the service. The socket is on the VM's read-only
// disks directory, its root's alone (0600: no other user of the VM can
// connect), and who connects is checked again at accept.
func (v supervised) serveMounts(pid int, mounts Mounts) (func(), error) {
	path := v.spec.MountSocket
	if path == "" || mounts == nil {
		return func() {}, nil
	}
	_ = os.Remove(path) // a supervisor's before a restart
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("the vm's mount service: %w", err)
	}
	l.SetUnlinkOnClose(true)
	root := v.spec.MountUID
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("the vm's mount service: %w", err)
	}
	if err := os.Lchown(path, int(root), int(root)); err != nil {
		l.Close()
		return nil, fmt.Errorf("the vm's mount service: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	vm := Served{Dir: v.dir, Locks: v.spec.Locks, InitPID: pid, Cgroup: v.spec.Cgroup}
	go func() {
		defer close(done)
		_ = mountsvc.Serve(ctx, l, func(p unix.Ucred) bool { return p.Uid == root }, func(ctx context.Context, peer unix.Ucred, req mountsvc.Request) error {
			return mounts(ctx, vm, peer, req)
		})
	}()
	return func() { cancel(); <-done }, nil
}

// supervised is one container VM as its supervisor runs it.
type supervised struct {
	dir  string
	spec superviseSpec
	// console is the VM's console log; drained is closed once the VM's
	// output pipe has nothing more.
	console *console.Log
	drained chan struct{}
}

// command is the runtime with its state root and log; it runs with the
// VM's marker, so a delete finds it too.
func (v supervised) command(args ...string) *exec.Cmd {
	s := v.spec
	cmd := exec.Command(s.Runtime, append([]string{"--root", s.RuntimeRoot, "--log", filepath.Join(v.dir, "runtime.log")}, args...)...)
	cmd.Env = []string{"PATH=" + procs.VMPath, procs.EnvMarker + "=" + s.CID}
	return cmd
}

// rt runs the runtime, its output in the error.
func (v supervised) rt(args ...string) error {
	cmd := v.command(args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s%s", filepath.Base(v.spec.Runtime), args[0], err, bytes.TrimSpace(out.Bytes()), lastLine(filepath.Join(v.dir, "runtime.log")))
	}
	return nil
}

// start creates the container, plugs its network in and starts its
// init, answering its pid; on failure the container is deleted.
func (v supervised) start(sigs chan os.Signal) (int, error) {
	s, dir := v.spec, v.dir
	_ = os.Remove(filepath.Join(dir, "exit_status"))
	_ = os.Remove(filepath.Join(dir, "container.pid"))
	// The runtime hands its stdio to the VM's init: a pipe into the
	// console log, capped and rotated.
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	go func() {
		_, _ = io.Copy(v.console, pr)
		pr.Close()
		close(v.drained)
	}()
	create := v.command("create", "--bundle", filepath.Join(dir, "bundle"), "--pid-file", filepath.Join(dir, "container.pid"), s.ID)
	create.Stdout, create.Stderr = pw, pw
	err = create.Run()
	pw.Close() // the VM's processes hold the write end now
	if err != nil {
		_ = v.rt("delete", "--force", s.ID)
		return 0, fmt.Errorf("%s create: %w%s", filepath.Base(s.Runtime), err, lastLine(filepath.Join(dir, "runtime.log")))
	}
	abort := func(err error) (int, error) {
		_ = v.rt("delete", "--force", s.ID)
		return 0, err
	}
	b, _ := os.ReadFile(filepath.Join(dir, "container.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 1 {
		return abort(errors.New("the runtime recorded no process for the vm"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err = s.Net.Connect(ctx, pid)
	cancel()
	if err != nil {
		return abort(err)
	}
	select {
	case <-sigs:
		return abort(errors.New("the vm was stopped while starting"))
	default:
	}
	if err := v.rt("start", s.ID); err != nil {
		return abort(err)
	}
	return pid, nil
}

// afterOutput waits for the VM's output to reach its console: once its
// PID 1 is gone the kernel ends every process of its PID namespace, and
// with them the pipe's write ends.
func (v supervised) afterOutput() {
	select {
	case <-v.drained:
	case <-time.After(5 * time.Second):
	}
}

// finish records how the VM's init ended (an OOM kill said on the
// console) and deletes the container.
func (v supervised) finish(status int) {
	s, dir := v.spec, v.dir
	if n := oomKills(s.Cgroup); n > 0 {
		msg := fmt.Sprintf("runway: vm %s was killed by the kernel's out-of-memory killer at its memory limit", s.CID)
		if s.RAM > 0 {
			msg += fmt.Sprintf(" of %d MiB (cloud_properties.ram)", s.RAM)
		}
		v.afterOutput()
		_, _ = v.console.Write([]byte(msg + "\n"))
	}
	_ = record.WriteFile(filepath.Join(dir, "exit_status"), []byte(strconv.Itoa(status)+"\n"))
	_ = v.rt("delete", "--force", s.ID)
}

// A supervisor reaps every child it has (a subreaper must: the runtime's
// processes are left to it). The children it starts itself (RunChild)
// get their status from that loop.
var children = struct {
	sync.Mutex
	supervising bool
	waiting     map[int]chan unix.WaitStatus
}{waiting: map[int]chan unix.WaitStatus{}}

// RunChild runs cmd (Stdout and Stderr unset) to its end and answers its
// output; in a supervisor, through its reaping loop. ctx ending kills it.
func RunChild(ctx context.Context, cmd *exec.Cmd) ([]byte, error) {
	children.Lock()
	supervising := children.supervising
	children.Unlock()
	if !supervising {
		return cmd.CombinedOutput()
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan unix.WaitStatus, 1)
	children.Lock()
	err = cmd.Start()
	if err == nil {
		children.waiting[cmd.Process.Pid] = done
	}
	children.Unlock()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, err
	}
	out := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(io.LimitReader(pr, 64<<10)); pr.Close(); out <- b }()
	var ws unix.WaitStatus
	select {
	case ws = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill() // not reaped yet: the pid is still its
		ws = <-done
	}
	b := <-out
	if ws.Exited() && ws.ExitStatus() == 0 {
		return b, nil
	}
	if ws.Signaled() {
		return b, fmt.Errorf("%s: killed by %s", filepath.Base(cmd.Path), ws.Signal())
	}
	return b, fmt.Errorf("%s: exit status %d", filepath.Base(cmd.Path), ws.ExitStatus())
}

// waitExit reaps children until pid is among them and answers its status
// the way a shell reports it (128+n for a signal).
func waitExit(pid int) int {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 255 // no child left: the VM is gone
		}
		children.Lock()
		if ch, ok := children.waiting[got]; ok {
			delete(children.waiting, got)
			ch <- ws
		}
		children.Unlock()
		if got != pid {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

// oomKills reads how many processes the OOM killer took in the cgroup
// (cgroup v1 memory.oom_control, or v2 memory.events).
func oomKills(cgroup string) int {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory", cgroup, "memory.oom_control"),
		filepath.Join("/sys/fs/cgroup", cgroup, "memory.events"),
		filepath.Join("/sys/fs/cgroup/unified", cgroup, "memory.events"),
	} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if n, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
				f.Close()
				v, _ := strconv.Atoi(n)
				return v
			}
		}
		f.Close()
	}
	return 0
}

// lastLine is the runtime log's last line, for an error message.
func lastLine(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if l := lines[len(lines)-1]; l != "" {
		var m struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal([]byte(l), &m) == nil && m.Msg != "" {
			l = m.Msg
		}
		return " (" + l + ")"
	}
	return ""
}
