package kubernetes

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// TestKilledCreateVM: bin/cpi killed with SIGKILL in the middle of
// create_vm — once as its pod appears, once as its settings appear —
// leaves nothing a sweep cannot find: list_vms by agent finds the pod,
// delete_vm removes it and its Secret.
func TestKilledCreateVM(t *testing.T) {
	c := devCluster(t)
	t.Cleanup(func() { assertNoneLeft(t, c) })
	bin, err := cpibin.Path("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg, _ := json.Marshal(map[string]any{"driver": "kubernetes", "state_dir": filepath.Join(dir, "state"),
		"kubernetes": map[string]any{"kubeconfig": c.kubeconfig, "namespace": c.ns, "delete_grace_seconds": 1}})
	cfgPath := filepath.Join(dir, "cpi.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	d := newTestDriver(t, c, nil)
	ctx := context.Background()
	sc, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})

	for _, point := range []struct {
		name string
		kind string // the object whose arrival triggers the kill
	}{{"as its pod appears", "vm"}, {"as its settings appear", "settings"}} {
		t.Run(point.name, func(t *testing.T) {
			agent := "kill9-" + point.kind
			w, err := c.admin.CoreV1().Secrets(c.ns).Watch(ctx, metav1.ListOptions{LabelSelector: labelKind + "=settings"})
			if point.kind == "vm" {
				w, err = c.admin.CoreV1().Pods(c.ns).Watch(ctx, metav1.ListOptions{LabelSelector: labelKind + "=vm"})
			}
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			req, _ := json.Marshal(map[string]any{"method": "create_vm", "api_version": 2,
				"arguments": []any{agent, sc, map[string]any{"command": []string{"sleep", "3600"}}, map[string]any{}, []string{}, map[string]any{}},
				"context":   map[string]any{"director_uuid": "kill9-director"}})
			cmd := exec.Command(bin, "-configPath", cfgPath)
			cmd.Stdin = strings.NewReader(string(req))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			timeout := time.After(60 * time.Second)
		watching:
			for {
				select {
				case ev := <-w.ResultChan():
					if ev.Type == watch.Added && ownedByAgent(ev.Object, agent) {
						break watching
					}
				case <-timeout:
					cmd.Process.Kill()
					t.Fatalf("no %s of agent %s appeared", point.kind, agent)
				}
			}
			cmd.Process.Kill()
			cmd.Wait()
			vms, err := d.ListVMs(ctx, map[string]string{"agent_id": agent})
			if err != nil || len(vms) != 1 {
				t.Fatalf("list_vms by agent after the kill = %+v, %v; want the one pod", vms, err)
			}
			if err := d.DeleteVM(ctx, vms[0].CID); err != nil {
				t.Fatalf("delete_vm of the orphan: %v", err)
			}
		})
	}
}

// ownedByAgent: a pod of agent, or any VM's settings (one create_vm at a
// time here).
func ownedByAgent(o any, agent string) bool {
	switch x := o.(type) {
	case *corev1.Pod:
		return x.Annotations[annoAgentID] == agent
	case *corev1.Secret:
		return true
	}
	return false
}
