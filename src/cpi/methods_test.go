package cpi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/rpc"
)

// core records every call of the core interface; fail, when set, is
// returned by every call instead.
type core struct {
	calls []string
	fail  error
}

func (d *core) rec(format string, a ...any) error {
	d.calls = append(d.calls, fmt.Sprintf(format, a...))
	return d.fail
}

func (d *core) StemcellFormats() []string { return []string{"fake-raw"} }
func (d *core) CreateStemcell(_ context.Context, s driver.StemcellSpec) (string, error) {
	return "sc-1", d.rec("CreateStemcell %s %s tags=%v", s.ImagePath, s.CloudProps.Raw(), s.Tags)
}
func (d *core) DeleteStemcell(_ context.Context, cid string) error {
	return d.rec("DeleteStemcell %s", cid)
}
func (d *core) CreateVM(_ context.Context, s driver.VMSpec) (driver.VM, error) {
	err := d.rec("CreateVM agent=%s stemcell=%s props=%s disks=%v tags=%v settings=%v", s.AgentID, s.StemcellCID, s.CloudProps.Raw(), s.DiskCIDs, s.Tags, s.AgentSettings != nil)
	return driver.VM{CID: "vm-1", Networks: driver.Networks{"default": {Type: "dynamic", IP: "10.0.0.5"}}}, err
}
func (d *core) DeleteVM(_ context.Context, cid string) error { return d.rec("DeleteVM %s", cid) }
func (d *core) HasVM(_ context.Context, cid string) (bool, error) {
	return true, d.rec("HasVM %s", cid)
}
func (d *core) RebootVM(_ context.Context, cid string) error { return d.rec("RebootVM %s", cid) }
func (d *core) SetVMMetadata(_ context.Context, cid string, md map[string]string) error {
	return d.rec("SetVMMetadata %s %v", cid, md)
}
func (d *core) CreateDisk(_ context.Context, s driver.DiskSpec) (string, error) {
	return "disk-1", d.rec("CreateDisk %d %s near=%q", s.SizeMiB, s.CloudProps.Raw(), s.VMCID)
}
func (d *core) DeleteDisk(_ context.Context, cid string) error { return d.rec("DeleteDisk %s", cid) }
func (d *core) HasDisk(_ context.Context, cid string) (bool, error) {
	return false, d.rec("HasDisk %s", cid)
}
func (d *core) AttachDisk(_ context.Context, vm, disk string) (any, error) {
	return map[string]string{"path": "/dev/sdc"}, d.rec("AttachDisk %s %s", vm, disk)
}
func (d *core) DetachDisk(_ context.Context, vm, disk string) error {
	return d.rec("DetachDisk %s %s", vm, disk)
}
func (d *core) GetDisks(_ context.Context, vm string) ([]string, error) {
	return nil, d.rec("GetDisks %s", vm)
}

// full is core plus every optional interface.
type full struct{ core }

func (d *full) CalculateVMCloudProperties(_ context.Context, r driver.Resources) (driver.Props, error) {
	return driver.PropsOf(map[string]any{"instance_type": "m5.large"}), d.rec("Calculate %d %d %d", r.CPU, r.RAM, r.EphemeralDiskSize)
}
func (d *full) ListVMs(_ context.Context, match map[string]string) ([]driver.VMInfo, error) {
	return []driver.VMInfo{
		{CID: "vm-1", AgentID: "a1", State: "running", Metadata: map[string]string{"job": "web"}},
		{CID: "vm-2", AgentID: "a2", State: "stopped", Metadata: map[string]string{"job": "db"}},
	}, d.rec("ListVMs %v", match)
}
func (d *full) StopVM(_ context.Context, cid string) error  { return d.rec("StopVM %s", cid) }
func (d *full) StartVM(_ context.Context, cid string) error { return d.rec("StartVM %s", cid) }
func (d *full) ResizeDisk(_ context.Context, cid string, size int) error {
	return d.rec("ResizeDisk %s %d", cid, size)
}
func (d *full) UpdateDisk(_ context.Context, cid string, size int, p driver.Props) (string, error) {
	return "disk-2", d.rec("UpdateDisk %s %d %s", cid, size, p.Raw())
}
func (d *full) SetDiskMetadata(_ context.Context, cid string, md map[string]string) error {
	return d.rec("SetDiskMetadata %s %v", cid, md)
}
func (d *full) SnapshotDisk(_ context.Context, cid string, md map[string]string) (string, error) {
	return "snap-1", d.rec("SnapshotDisk %s %v", cid, md)
}
func (d *full) DeleteSnapshot(_ context.Context, cid string) error {
	return d.rec("DeleteSnapshot %s", cid)
}

func call(t *testing.T, d driver.Driver, method string, api int, args ...any) (*core, string, *rpc.Error) {
	t.Helper()
	s := &Service{Config: &config.Config{Driver: "fake"}, Driver: d, Logger: logging.Discard()}
	ctx := map[string]any{"director_uuid": "dir-1", "vm": map[string]any{"stemcell": map[string]any{"api_version": 2}}}
	// Through the wire's encoding, as a request arrives.
	req, err := rpc.NewRequest(method, api, ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(req)
	req, perr := rpc.ParseRequest(b)
	if perr != nil {
		t.Fatal(perr)
	}
	res, werr := s.Call(context.Background(), req)
	b, _ = json.Marshal(res)
	var c *core
	switch d := d.(type) {
	case *core:
		c = d
	case *full:
		c = &d.core
	}
	return c, string(b), werr
}

var md = map[string]any{"director": "dir-1", "index": 0.0, "compiling": true}

// Each method's arguments reach the driver as the Director sent them, and
// its answer is shaped as that API version expects.
func TestEveryMethodThroughAFakeDriver(t *testing.T) {
	nets := map[string]any{"default": map[string]any{"type": "dynamic"}}
	for _, tc := range []struct {
		method string
		api    int
		args   []any
		call   string // the driver call recorded ("" for none)
		result string
	}{
		{"info", 2, nil, "", `{"api_version":3,"stemcell_formats":["fake-raw"]}`},
		{"create_stemcell", 2, []any{"/tmp/image", map[string]any{"name": "s"}}, `CreateStemcell /tmp/image {"name":"s"} tags=map[created_by:runway director:dir-1]`, `"sc-1"`},
		{"create_stemcell", 3, []any{"/tmp/image", map[string]any{}, map[string]any{"tags": map[string]any{"team": "a"}}}, `CreateStemcell /tmp/image {} tags=map[created_by:runway director:dir-1 team:a]`, `"sc-1"`},
		{"delete_stemcell", 2, []any{"sc-1"}, "DeleteStemcell sc-1", "null"},
		{"create_vm", 1, []any{"agent-1", "sc-1", map[string]any{"flavor": "x"}, nets, []string{"disk-9"}, map[string]any{}},
			"CreateVM agent=agent-1 stemcell=sc-1 props={\"flavor\":\"x\"} disks=[disk-9] tags=map[agent_id:agent-1 created_by:runway director:dir-1] settings=true", `"vm-1"`},
		{"create_vm", 2, []any{"agent-1", "sc-1", map[string]any{}, nets, nil, map[string]any{"bosh": map[string]any{"tags": map[string]any{"deployment": "d"}}}},
			"CreateVM agent=agent-1 stemcell=sc-1 props={} disks=[] tags=map[agent_id:agent-1 created_by:runway deployment:d director:dir-1] settings=true",
			`["vm-1",{"default":{"type":"dynamic","ip":"10.0.0.5","cloud_properties":{}}}]`},
		{"delete_vm", 2, []any{"vm-1"}, "DeleteVM vm-1", "null"},
		{"has_vm", 2, []any{"vm-1"}, "HasVM vm-1", "true"},
		{"reboot_vm", 2, []any{"vm-1"}, "RebootVM vm-1", "null"},
		{"set_vm_metadata", 2, []any{"vm-1", md}, "SetVMMetadata vm-1 map[compiling:true director:dir-1 index:0]", "null"},
		{"create_disk", 2, []any{1024, map[string]any{"type": "gp3"}, "vm-1"}, `CreateDisk 1024 {"type":"gp3"} near="vm-1"`, `"disk-1"`},
		{"create_disk", 2, []any{1024, map[string]any{}, nil}, `CreateDisk 1024 {} near=""`, `"disk-1"`},
		{"delete_disk", 2, []any{"disk-1"}, "DeleteDisk disk-1", "null"},
		{"has_disk", 2, []any{"disk-1"}, "HasDisk disk-1", "false"},
		{"attach_disk", 1, []any{"vm-1", "disk-1"}, "AttachDisk vm-1 disk-1", "null"},
		{"attach_disk", 2, []any{"vm-1", "disk-1"}, "AttachDisk vm-1 disk-1", `{"path":"/dev/sdc"}`},
		{"detach_disk", 2, []any{"vm-1", "disk-1"}, "DetachDisk vm-1 disk-1", "null"},
		{"get_disks", 2, []any{"vm-1"}, "GetDisks vm-1", "[]"},
		{"calculate_vm_cloud_properties", 2, []any{map[string]any{"cpu": 2, "ram": 4096, "ephemeral_disk_size": 10240}}, "Calculate 2 4096 10240", `{"instance_type":"m5.large"}`},
		{"list_vms", 2, []any{map[string]any{"director": "dir-1"}, map[string]any{"job": "web"}}, "ListVMs map[director:dir-1]",
			`[{"cid":"vm-1","agent_id":"a1","state":"running","tags":null,"metadata":{"job":"web"},"networks":null}]`},
		{"stop_vm", 2, []any{"vm-1"}, "StopVM vm-1", "null"},
		{"start_vm", 2, []any{"vm-1"}, "StartVM vm-1", "null"},
		{"resize_disk", 2, []any{"disk-1", 2048}, "ResizeDisk disk-1 2048", "null"},
		{"update_disk", 2, []any{"disk-1", 2048, map[string]any{"type": "io2"}}, `UpdateDisk disk-1 2048 {"type":"io2"}`, `"disk-2"`},
		{"set_disk_metadata", 2, []any{"disk-1", md}, "SetDiskMetadata disk-1 map[compiling:true director:dir-1 index:0]", "null"},
		{"snapshot_disk", 2, []any{"disk-1", md}, "SnapshotDisk disk-1 map[compiling:true director:dir-1 index:0]", `"snap-1"`},
		{"delete_snapshot", 2, []any{"snap-1"}, "DeleteSnapshot snap-1", "null"},
	} {
		t.Run(fmt.Sprintf("%s/v%d", tc.method, tc.api), func(t *testing.T) {
			c, got, werr := call(t, &full{}, tc.method, tc.api, tc.args...)
			if werr != nil {
				t.Fatalf("%s: %s", werr.Type, werr.Message)
			}
			if want := []string{tc.call}; tc.call == "" && len(c.calls) != 0 || tc.call != "" && !slices.Equal(c.calls, want) {
				t.Errorf("driver calls %q, want %q", c.calls, tc.call)
			}
			if !jsonEqual(got, tc.result) {
				t.Errorf("answer %s, want %s", got, tc.result)
			}
		})
	}
	names := Methods()
	for _, m := range []string{"configure_networks", "current_vm_id"} {
		names = slices.DeleteFunc(names, func(n string) bool { return n == m })
	}
	if len(names) != 23 {
		t.Errorf("%d methods answered by a driver; the table above covers 23: %v", len(names), names)
	}
}

func jsonEqual(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && fmt.Sprint(x) == fmt.Sprint(y)
}

// A driver with only the core answers every optional method with
// NotImplemented naming the driver, and calls nothing.
func TestOptionalMethodsOfACoreDriver(t *testing.T) {
	for method, args := range map[string][]any{
		"calculate_vm_cloud_properties": {map[string]any{"cpu": 1, "ram": 1, "ephemeral_disk_size": 1}},
		"list_vms":                      {}, "stop_vm": {"vm-1"}, "start_vm": {"vm-1"},
		"resize_disk": {"disk-1", 10}, "update_disk": {"disk-1", 10, map[string]any{}},
		"set_disk_metadata": {"disk-1", md}, "snapshot_disk": {"disk-1", md}, "delete_snapshot": {"snap-1"},
	} {
		c, _, werr := call(t, &core{}, method, 2, args...)
		if werr == nil || werr.Type != "Bosh::Clouds::NotImplemented" || !strings.Contains(werr.Message, "driver fake") {
			t.Errorf("%s: %+v, want NotImplemented naming the driver", method, werr)
		}
		if len(c.calls) != 0 {
			t.Errorf("%s called %q", method, c.calls)
		}
	}
}

// Arguments a method refuses before the driver sees them.
func TestArgumentsRefusedBeforeTheDriver(t *testing.T) {
	for _, tc := range []struct {
		method string
		args   []any
		want   string
	}{
		{"create_vm", []any{"", "sc-1", map[string]any{}, map[string]any{}, nil, nil}, "agent_id"},
		{"create_disk", []any{0, map[string]any{}, nil}, "disk_size"},
		{"resize_disk", []any{"disk-1", -1}, "new_size"},
		{"update_disk", []any{"disk-1", 0, map[string]any{}}, "new_size"},
		{"calculate_vm_cloud_properties", []any{map[string]any{"cpu": -1, "ram": 1, "ephemeral_disk_size": 1}}, "negative"},
		{"has_vm", []any{}, "vm_cid"},
		{"has_vm", []any{42}, "vm_cid"},
		{"set_vm_metadata", []any{"vm-1", "not an object"}, "metadata"},
		{"attach_disk", []any{"vm-1", "disk-1", "extra"}, "argument"},
	} {
		c, _, werr := call(t, &full{}, tc.method, 2, tc.args...)
		if werr == nil || werr.Type != "Bosh::Clouds::CpiError" || !strings.Contains(werr.Message, tc.want) {
			t.Errorf("%s %v: %+v, want a CpiError naming %s", tc.method, tc.args, werr, tc.want)
		}
		if len(c.calls) != 0 {
			t.Errorf("%s %v reached the driver: %q", tc.method, tc.args, c.calls)
		}
	}
	if _, _, werr := call(t, &full{}, "configure_networks", 1, "vm-1", map[string]any{}); werr == nil || werr.Type != "Bosh::Clouds::NotSupported" {
		t.Errorf("configure_networks: %+v, want NotSupported (the Director recreates the VM)", werr)
	}
	if _, _, werr := call(t, &full{}, "attach_disk", 2, "vm-1", "disk-1"); werr != nil {
		t.Fatal(werr.Message)
	}
}

// The driver's sentinel errors become the types the Director acts on.
func TestDriverErrorsBecomeBoshTypes(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("vm-1: %w", driver.ErrVMNotFound):                     "Bosh::Clouds::VMNotFound",
		fmt.Errorf("disk-1: %w", driver.ErrDiskNotFound):                 "Bosh::Clouds::DiskNotFound",
		fmt.Errorf("disk-1: %w", driver.ErrDiskNotAttached):              "Bosh::Clouds::DiskNotAttached",
		fmt.Errorf("no: %w", driver.ErrNotSupported):                     "Bosh::Clouds::NotSupported",
		fmt.Errorf("full: %w", driver.ErrNoDiskSpace):                    "Bosh::Clouds::NoDiskSpace",
		fmt.Errorf("no api: %w", driver.ErrNotImplemented):               "Bosh::Clouds::NotImplemented",
		fmt.Errorf("bad: %w", driver.ErrInvalidInput):                    "Bosh::Clouds::CpiError",
		&driver.CreationError{Retryable: true, Err: errors.New("quota")}: "Bosh::Clouds::VMCreationFailed",
		context.DeadlineExceeded:                                         "Bosh::Clouds::VMCreationFailed",
		errors.New("anything else"):                                      "Bosh::Clouds::CloudError",
	} {
		_, _, werr := call(t, &full{core: core{fail: err}}, "create_vm", 2, "agent-1", "sc-1", map[string]any{}, map[string]any{}, nil, nil)
		if werr == nil || werr.Type != want {
			t.Errorf("%v: %+v, want %s", err, werr, want)
		}
		if want == "Bosh::Clouds::VMCreationFailed" && !werr.OkToRetry {
			t.Errorf("%v: not ok_to_retry", err)
		}
	}
	// Outside create_vm a deadline is a CloudError.
	if _, _, werr := call(t, &full{core: core{fail: context.DeadlineExceeded}}, "delete_vm", 2, "vm-1"); werr == nil || werr.Type != "Bosh::Clouds::CloudError" {
		t.Errorf("delete_vm past its deadline: %+v", werr)
	}
}
