package vsphere

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/view"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver"
)

// datastore is what placement reads of one datastore.
type datastore struct {
	ref  types.ManagedObjectReference
	name string
	free int64 // bytes
}

// cluster is one placement target: a cluster, the pool VMs go into, and
// the datastores its hosts see.
type cluster struct {
	name       string
	ref        types.ManagedObjectReference
	pool       types.ManagedObjectReference
	datastores []datastore
}

// retrieve reads properties of objects of kind under root (recursive).
func (vc *vcenter) retrieve(ctx context.Context, root types.ManagedObjectReference, kind string, props []string, dst any) error {
	v, err := view.NewManager(vc.c).CreateContainerView(ctx, root, []string{kind}, true)
	if err != nil {
		return err
	}
	defer func() { _ = v.Destroy(context.WithoutCancel(ctx)) }()
	return v.Retrieve(ctx, []string{kind}, props, dst)
}

// folder finds the datacenter folder rel (under vm/), making what is missing.
func (d *Driver) folder(ctx context.Context, vc *vcenter, rel string) (*object.Folder, error) {
	vc.mu.Lock()
	defer vc.mu.Unlock()
	if f, ok := vc.folders[rel]; ok {
		return f, nil
	}
	f, err := d.findFolder(ctx, vc, rel)
	if err == nil {
		if vc.folders == nil {
			vc.folders = map[string]*object.Folder{}
		}
		vc.folders[rel] = f
	}
	return f, err
}

func (d *Driver) findFolder(ctx context.Context, vc *vcenter, rel string) (*object.Folder, error) {
	folders, err := vc.dc.Folders(ctx)
	if err != nil {
		return nil, d.cloudErr("find folders", err)
	}
	f := folders.VmFolder
	for _, name := range strings.Split(rel, "/") {
		p := path.Join(f.InventoryPath, name)
		next, err := vc.finder.Folder(ctx, p)
		if notFound(err) {
			next, err = f.CreateFolder(ctx, name)
			if fault.Is(err, &types.DuplicateName{}) {
				next, err = vc.finder.Folder(ctx, p) // made meanwhile by another call
			}
			if next != nil {
				next.InventoryPath = p
			}
		}
		if err != nil {
			return nil, d.cloudErr("folder "+rel, err)
		}
		f = next
	}
	return f, nil
}

// clusters resolves cluster references (the config's, or a VM's cloud
// properties') with their pools and the datastores they see.
func (d *Driver) clusters(ctx context.Context, vc *vcenter, refs []ClusterRef) ([]cluster, error) {
	var all []mo.ClusterComputeResource
	if err := vc.retrieve(ctx, vc.dc.Reference(), "ClusterComputeResource", []string{"name", "resourcePool", "datastore"}, &all); err != nil {
		return nil, d.cloudErr("list clusters", err)
	}
	var out []cluster
	var dsRefs []types.ManagedObjectReference
	for _, r := range refs {
		i := slices.IndexFunc(all, func(c mo.ClusterComputeResource) bool { return c.Name == r.Name })
		if i < 0 {
			return nil, fmt.Errorf("vsphere: cluster %q not found in datacenter %q", r.Name, d.cfg.dc().Name)
		}
		c := cluster{name: r.Name, ref: all[i].Self, pool: *all[i].ResourcePool}
		if r.ResourcePool != "" {
			p, err := d.pool(ctx, vc, c, r.ResourcePool)
			if err != nil {
				return nil, err
			}
			c.pool = p
		}
		for _, ds := range all[i].Datastore {
			c.datastores = append(c.datastores, datastore{ref: ds})
		}
		dsRefs = append(dsRefs, all[i].Datastore...)
		out = append(out, c)
	}
	info, err := d.datastoreInfo(ctx, vc, dsRefs)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].datastores = usable(out[i].datastores, info)
	}
	return out, nil
}

// pool finds a resource pool by name within a cluster.
func (d *Driver) pool(ctx context.Context, vc *vcenter, c cluster, name string) (types.ManagedObjectReference, error) {
	var pools []mo.ResourcePool
	if err := vc.retrieve(ctx, c.ref, "ResourcePool", []string{"name"}, &pools); err != nil {
		return types.ManagedObjectReference{}, d.cloudErr("list resource pools", err)
	}
	for _, p := range pools {
		if p.Name == name {
			return p.Self, nil
		}
	}
	return types.ManagedObjectReference{}, fmt.Errorf("vsphere: resource pool %q not found in cluster %q", name, c.name)
}

// datastoreInfo reads the datastores' names and free space.
func (d *Driver) datastoreInfo(ctx context.Context, vc *vcenter, refs []types.ManagedObjectReference) (map[types.ManagedObjectReference]mo.Datastore, error) {
	out := map[types.ManagedObjectReference]mo.Datastore{}
	refs = uniqueRefs(refs)
	if len(refs) == 0 {
		return out, nil
	}
	var list []mo.Datastore
	if err := vc.pc.Retrieve(ctx, refs, []string{"summary"}, &list); err != nil {
		return nil, d.cloudErr("read datastores", err)
	}
	for _, ds := range list {
		out[ds.Self] = ds
	}
	return out, nil
}

// usable fills in the datastores that are accessible and not entering
// maintenance.
func usable(dss []datastore, info map[types.ManagedObjectReference]mo.Datastore) []datastore {
	var out []datastore
	for _, ds := range dss {
		i, ok := info[ds.ref]
		if !ok || !i.Summary.Accessible || i.Summary.MaintenanceMode == string(types.DatastoreSummaryMaintenanceModeStateInMaintenance) ||
			i.Summary.MaintenanceMode == string(types.DatastoreSummaryMaintenanceModeStateEnteringMaintenance) {
			continue
		}
		out = append(out, datastore{ref: ds.ref, name: i.Summary.Name, free: i.Summary.FreeSpace})
	}
	return out
}

func uniqueRefs(refs []types.ManagedObjectReference) []types.ManagedObjectReference {
	seen := map[types.ManagedObjectReference]bool{}
	var out []types.ManagedObjectReference
	for _, r := range refs {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}

// matcher picks datastores by a pattern (the config's) or by exact names
// (cloud properties' datastores).
type matcher struct {
	re    *regexp.Regexp
	names []string
}

func (m matcher) match(name string) bool {
	if len(m.names) > 0 {
		return slices.Contains(m.names, name)
	}
	return m.re.MatchString(name)
}

func (m matcher) String() string {
	if len(m.names) > 0 {
		return "datastores " + strings.Join(m.names, ", ")
	}
	return "pattern " + m.re.String()
}

func patternMatcher(p string) matcher {
	re, err := compilePattern(p)
	if err != nil {
		re = regexp.MustCompile(`^$`) // validated at load
	}
	return matcher{re: re}
}

// pick chooses a datastore with room for need bytes, weighted by free
// space (as the official CPI: randomly, larger ones likelier).
func pick(dss []datastore, m matcher, need int64) (datastore, bool) {
	var fits []datastore
	var total float64
	for _, ds := range dss {
		if m.match(ds.name) && ds.free >= need {
			fits = append(fits, ds)
			total += float64(ds.free)
		}
	}
	if len(fits) == 0 {
		return datastore{}, false
	}
	x := rand.Float64() * total
	for _, ds := range fits {
		if x -= float64(ds.free); x < 0 {
			return ds, true
		}
	}
	return fits[len(fits)-1], true
}

// noPlacement says why nothing fitted.
func noPlacement(what string, m matcher, need int64, clusters []cluster) error {
	var seen []string
	for _, c := range clusters {
		for _, ds := range c.datastores {
			seen = append(seen, fmt.Sprintf("%s (%d MiB free)", ds.name, ds.free>>20))
		}
	}
	return fmt.Errorf("%w: vsphere: no datastore matching %s has %d MiB free for %s (usable datastores: %s)",
		errNoPlacement, m, need>>20, what, strings.Join(seen, ", "))
}

// network finds a port group by its name or path in the datacenter.
func (d *Driver) network(ctx context.Context, vc *vcenter, name string) (object.NetworkReference, error) {
	n, err := vc.finder.Network(ctx, name)
	if notFound(err) {
		return nil, driver.Invalid("network %q (cloud_properties.name) not found in datacenter %q", name, d.cfg.dc().Name)
	}
	if err != nil {
		return nil, d.cloudErr("find network "+name, err)
	}
	return n, nil
}
