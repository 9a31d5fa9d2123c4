// Package vsphere is the vSphere driver, a drop-in for the official vSphere
// CPI (bosh-vsphere-cpi-release) on govmomi: stemcells are OVFs imported as
// templates and replicated per datastore for linked clones, VMs are clones
// whose agent settings sit on a CD-ROM ISO (env.json, as the official CPI
// writes it), persistent disks are independent vmdks under disk_path,
// metadata are custom fields. Every vCenter call runs inside the CPI's wait
// budget (throttles and transient faults waited out and logged), an expired
// session is renewed once and the call repeated, and a create that fails
// part-way removes what it made.
package vsphere

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/property"
	"github.com/vmware/govmomi/vim25"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/driver/clouddeps"
)

// Driver implements driver.Driver on vSphere.
type Driver struct {
	clouddeps.Base
	cfg      Config
	stateDir string

	once    sync.Once
	vc      *vcenter
	initErr error

	// requests counts HTTP requests to vCenter and its hosts (benchmarks).
	requests atomic.Int64
}

// The optional interfaces it has; snapshots (a vmdk attached to a running
// VM is locked) and disk metadata (a vmdk carries none) answer
// NotImplemented, as the official CPI.
var (
	_ driver.VMSizer     = (*Driver)(nil)
	_ driver.VMLister    = (*Driver)(nil)
	_ driver.PowerSwitch = (*Driver)(nil)
	_ driver.DiskResizer = (*Driver)(nil)
)

// New builds the driver from its config section. No network I/O happens
// until a method needs vCenter.
func New(section json.RawMessage, deps driver.Deps) (*Driver, error) {
	c, err := parseConfig(section)
	if err != nil {
		return nil, err
	}
	if deps.Redact != nil {
		deps.Redact(c.Password)
	}
	return &Driver{Base: clouddeps.New("vsphere", deps.Locker, deps.Logger, deps.Retry, classify), cfg: c, stateDir: deps.StateDir}, nil
}

// StemcellFormats: OVF stemcells (a tarball of the OVF and its disks) and
// OVAs, as the official CPI.
func (d *Driver) StemcellFormats() []string { return catalog.Formats("vsphere") }

// Requests is how many HTTP requests the driver sent (benchmarks).
func (d *Driver) Requests() int64 { return d.requests.Load() }

// vcenter is one logged-in connection and the inventory the config names.
type vcenter struct {
	c      *vim25.Client
	pc     *property.Collector
	finder *find.Finder
	dc     *object.Datacenter
	sess   *session

	mu      sync.Mutex
	folders map[string]*object.Folder // found or made in this process
}

// client connects (once per process) and finds the datacenter.
func (d *Driver) client(ctx context.Context) (*vcenter, error) {
	d.once.Do(func() { d.vc, d.initErr = d.connect(ctx) })
	if d.initErr != nil {
		return nil, d.initErr
	}
	return d.vc, nil
}

func (d *Driver) connect(ctx context.Context) (*vcenter, error) {
	s, err := d.newSession(ctx)
	if err != nil {
		return nil, err
	}
	f := find.NewFinder(s.client, false)
	var dc *object.Datacenter
	err = d.call(ctx, "find datacenter", func(ctx context.Context) error {
		var err error
		dc, err = f.Datacenter(ctx, d.cfg.dc().Name)
		return err
	})
	if err != nil {
		var nf *find.NotFoundError
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("vsphere: datacenter %q not found on %s", d.cfg.dc().Name, d.cfg.hostName())
		}
		return nil, d.cloudErr("find datacenter", err)
	}
	f.SetDatacenter(dc)
	return &vcenter{c: s.client, pc: property.DefaultCollector(s.client), finder: f, dc: dc, sess: s}, nil
}

// call runs one step against vCenter inside the retry budget (the
// session's round tripper has already renewed an expired session).
func (d *Driver) call(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	return d.Retry.Do(ctx, "vsphere "+op, fn)
}

// CIDs: vm-<uuid> and sc-<uuid> as the official CPI names them, and its
// disk-<uuid>, optionally followed by ".<base64 of JSON>" (the datastore
// pattern a disk was made for); snap-<uuid> are Runway's.
var (
	vmCIDRe   = regexp.MustCompile(`^vm-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	scCIDRe   = regexp.MustCompile(`^sc-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	diskCIDRe = regexp.MustCompile(`^(disk-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(\.[A-Za-z0-9_=-]{1,1000})?$`)
	snapCIDRe = regexp.MustCompile(`^snap-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

func validVM(cid string) error {
	if !vmCIDRe.MatchString(cid) {
		return driver.Invalid("vm cid %q is not a vSphere CPI VM name (vm-<uuid>)", clipCID(cid))
	}
	return nil
}

func validStemcell(cid string) error {
	if !scCIDRe.MatchString(cid) {
		return driver.Invalid("stemcell cid %q is not a vSphere CPI stemcell name (sc-<uuid>)", clipCID(cid))
	}
	return nil
}

// diskName is the vmdk's base name of a disk cid (its metadata suffix off).
func diskName(cid string) (string, error) {
	m := diskCIDRe.FindStringSubmatch(cid)
	if m == nil {
		return "", driver.Invalid("disk cid %q is not a vSphere CPI disk (disk-<uuid>)", clipCID(cid))
	}
	return m[1], nil
}

func clipCID(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func newName(prefix string) string { return prefix + "-" + uuid.NewString() }

// dsPath is "[datastore] path".
func dsPath(ds, p string) string { return "[" + ds + "] " + p }

// splitDSPath reads "[datastore] path".
func splitDSPath(p string) (ds, rel string, ok bool) {
	if !strings.HasPrefix(p, "[") {
		return "", "", false
	}
	i := strings.Index(p, "] ")
	if i < 0 {
		return "", "", false
	}
	return p[1:i], p[i+2:], true
}
