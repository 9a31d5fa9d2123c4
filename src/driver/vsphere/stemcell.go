package vsphere

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/nfc"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/ovf"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/stemcellimage"
)

// CreateStemcell imports the stemcell's OVF as a VM named sc-<uuid> in
// template_folder on a datastore of datastore_pattern, without NICs, and
// snapshots it ("initial") for linked clones — as the official CPI.
func (d *Driver) CreateStemcell(ctx context.Context, spec driver.StemcellSpec) (string, error) {
	var p stemcellProps
	if err := spec.CloudProps.Decode("cloud_properties", &p); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(d.tmpDir(), "stemcell-")
	if err != nil {
		return "", fmt.Errorf("vsphere: %w", err)
	}
	defer os.RemoveAll(dir)
	files, size, err := unpackOVF(spec.ImagePath, dir)
	if err != nil {
		return "", err
	}
	vc, err := d.client(ctx)
	if err != nil {
		return "", err
	}
	cs, err := d.clusters(ctx, vc, d.cfg.dc().Clusters)
	if err != nil {
		return "", err
	}
	m := patternMatcher(d.cfg.dc().DatastorePattern)
	for _, c := range shuffled(cs) {
		ds, ok := pick(c.datastores, m, size)
		if !ok {
			continue
		}
		name := newName("sc")
		if err := d.importOVF(ctx, vc, name, dir, files, c, ds); err != nil {
			return "", err
		}
		d.Log.Info("stemcell imported", "stemcell", name, "cluster", c.name, "datastore", ds.name)
		return name, nil
	}
	return "", noPlacement("the stemcell", m, size, cs)
}

// tmpDir is where stemcells are unpacked: the state dir (it has room
// for images), else the system's.
func (d *Driver) tmpDir() string {
	if d.stateDir == "" {
		return ""
	}
	dir := filepath.Join(d.stateDir, "vsphere", "tmp")
	if os.MkdirAll(dir, 0o700) != nil {
		return ""
	}
	return dir
}

var ovfFileName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$`)

// unpackOVF writes the image's files (a tarball, gzipped or not: the
// stemcell's image, or an OVA) into dir: regular files at its top level
// only, anything else refused by name. It answers the files by name.
func unpackOVF(image, dir string) (map[string]string, int64, error) {
	r, _, closeFn, err := stemcellimage.Open(image)
	if err != nil {
		return nil, 0, driver.Invalid("stemcell image: %v", err)
	}
	defer closeFn()
	files := map[string]string{}
	var size int64
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, driver.Invalid("stemcell image is not a tarball: %v", err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if h.Typeflag == tar.TypeDir && (name == "" || name == ".") {
			continue
		}
		if n > 64 || h.Typeflag != tar.TypeReg || !ovfFileName.MatchString(name) {
			return nil, 0, driver.Invalid("stemcell image: entry %q: an OVF stemcell holds only files at its top level", clipCID(h.Name))
		}
		out, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, 0, driver.Invalid("stemcell image: entry %q: %v", name, err)
		}
		written, err := io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, 0, fmt.Errorf("vsphere: unpacking the stemcell: %w", err)
		}
		files[name] = filepath.Join(dir, name)
		size += written
	}
	return files, size, nil
}

// importOVF imports the OVF into the cluster's pool on ds; a failure
// removes what was made.
func (d *Driver) importOVF(ctx context.Context, vc *vcenter, name, dir string, files map[string]string, c cluster, ds datastore) error {
	var desc []byte
	for n, p := range files {
		if strings.HasSuffix(n, ".ovf") {
			b, err := os.ReadFile(p)
			if err != nil {
				return fmt.Errorf("vsphere: %w", err)
			}
			desc = b
		}
	}
	if desc == nil {
		return driver.Invalid("stemcell image holds no .ovf descriptor")
	}
	if _, err := ovf.Unmarshal(strings.NewReader(string(desc))); err != nil {
		return driver.Invalid("stemcell image: the OVF descriptor: %v", err)
	}
	folder, err := d.folder(ctx, vc, d.cfg.dc().TemplateFolder)
	if err != nil {
		return err
	}
	res, err := ovf.NewManager(vc.c).CreateImportSpec(ctx, string(desc), object.NewResourcePool(vc.c, c.pool),
		object.NewDatastore(vc.c, ds.ref), &types.OvfCreateImportSpecParams{EntityName: name})
	if err != nil {
		return d.cloudErr("create import spec", err)
	}
	if res.Error != nil {
		return driver.Invalid("stemcell image: vCenter refused the OVF: %s", res.Error[0].LocalizedMessage)
	}
	d.importSpec(res.ImportSpec)
	lease, err := object.NewResourcePool(vc.c, c.pool).ImportVApp(ctx, res.ImportSpec, folder, nil)
	if err != nil {
		return d.cloudErr("import the stemcell", err)
	}
	info, err := lease.Wait(ctx, res.FileItem)
	if err != nil {
		return d.cloudErr("import the stemcell (lease)", err)
	}
	if err := d.upload(ctx, lease, info, files); err != nil {
		_ = lease.Abort(context.WithoutCancel(ctx), &types.LocalizedMethodFault{LocalizedMessage: err.Error()})
		return err
	}
	if err := lease.Complete(ctx); err != nil {
		return d.cloudErr("import the stemcell (complete)", err)
	}
	vm := object.NewVirtualMachine(vc.c, info.Entity)
	if err := d.snapshot(ctx, vm); err != nil {
		d.destroy(context.WithoutCancel(ctx), vm)
		return err
	}
	return nil
}

// importSpec drops the OVF's NICs (create_vm adds the VM's own) and sets
// the system disk's provisioning to default_disk_type.
func (d *Driver) importSpec(spec types.BaseImportSpec) {
	vs, ok := spec.(*types.VirtualMachineImportSpec)
	if !ok {
		return
	}
	var keep []types.BaseVirtualDeviceConfigSpec
	for _, ch := range vs.ConfigSpec.DeviceChange {
		dev := ch.GetVirtualDeviceConfigSpec().Device
		if _, nic := dev.(types.BaseVirtualEthernetCard); nic {
			continue
		}
		if disk, ok := dev.(*types.VirtualDisk); ok {
			if b, ok := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo); ok {
				b.ThinProvisioned = types.NewBool(d.cfg.DefaultDiskType == "thin")
			}
		}
		keep = append(keep, ch)
	}
	vs.ConfigSpec.DeviceChange = keep
}

// upload sends each disk the lease asks for.
func (d *Driver) upload(ctx context.Context, lease *nfc.Lease, info *nfc.LeaseInfo, files map[string]string) error {
	u := lease.StartUpdater(ctx, info)
	defer u.Done()
	for _, item := range info.Items {
		p, ok := files[item.Path]
		if !ok {
			return driver.Invalid("stemcell image: the OVF names %q, which the tarball does not hold", item.Path)
		}
		err := d.Retry.Do(ctx, "vsphere upload "+item.Path, func(ctx context.Context) error {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			up := soap.DefaultUpload
			up.ContentLength, up.Type = st.Size(), "application/x-vnd.vmware-streamVmdk"
			return lease.Upload(ctx, item, f, up)
		})
		if err != nil {
			return d.cloudErr("upload "+item.Path, err)
		}
	}
	return nil
}

// snapshot takes the "initial" snapshot linked clones are made from.
func (d *Driver) snapshot(ctx context.Context, vm *object.VirtualMachine) error {
	t, err := vm.CreateSnapshot(ctx, "initial", "", false, false)
	err = waitTask(ctx, t, err)
	return d.cloudErr("snapshot the stemcell", err)
}

// destroy deletes a VM this call made (best effort: the call already failed).
func (d *Driver) destroy(ctx context.Context, vm *object.VirtualMachine) {
	t, err := vm.Destroy(ctx)
	err = waitTask(ctx, t, err)
	if err != nil && !notFound(err) {
		d.Log.Warn("could not remove what a failed call made", "vm", vm.Reference().Value, "err", err)
	}
}

// DeleteStemcell deletes the stemcell and its replicas; a stemcell that
// is gone is not an error (the Director retries deletes).
func (d *Driver) DeleteStemcell(ctx context.Context, cid string) error {
	if err := validStemcell(cid); err != nil {
		return err
	}
	vc, err := d.client(ctx)
	if err != nil {
		return err
	}
	replicas, err := d.replicas(ctx, vc, cid)
	if err != nil {
		return err
	}
	for _, r := range replicas {
		t, err := object.NewVirtualMachine(vc.c, r.Self).Destroy(ctx)
		err = waitTask(ctx, t, err)
		if err != nil && !notFound(err) {
			return d.cloudErr("delete stemcell "+r.Name, err)
		}
		d.Log.Info("stemcell replica deleted", "name", r.Name)
	}
	return nil
}

// replicas are the stemcell's VMs in the template folder: the original
// (named cid) and its copies (cid %2f <datastore id>).
func (d *Driver) replicas(ctx context.Context, vc *vcenter, cid string) ([]mo.VirtualMachine, error) {
	vms, err := d.folderVMs(ctx, vc, d.cfg.dc().TemplateFolder, "list stemcells", "name", "datastore", "snapshot")
	if err != nil {
		return nil, err
	}
	var out []mo.VirtualMachine
	for _, vm := range vms {
		if vm.Name == cid || strings.HasPrefix(vm.Name, cid+replicaSep) {
			out = append(out, vm)
		}
	}
	return out, nil
}

// replicaSep joins a stemcell's name and a datastore's id in a replica's
// name: the official CPI's " %2f " (vCenter shows "sc-… / datastore-…"),
// so replicas either CPI made are found by both. vcsim takes the escaped
// slash for a directory separator; its tests use another (docs/vsphere.md).
var replicaSep = " %2f "

// replica is the stemcell's copy on ds (made when missing, as the
// official CPI: linked clones need their parent on their datastore).
func (d *Driver) replica(ctx context.Context, vc *vcenter, cid string, c cluster, ds datastore) (*object.VirtualMachine, *types.ManagedObjectReference, error) {
	release, err := d.Locks.Lock(ctx, "stemcell-"+cid+"-"+ds.ref.Value)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	all, err := d.replicas(ctx, vc, cid)
	if err != nil {
		return nil, nil, err
	}
	if len(all) == 0 {
		return nil, nil, fmt.Errorf("%w: stemcell %s", driver.ErrStemcellNotFound, cid)
	}
	for _, r := range all {
		if len(r.Datastore) > 0 && r.Datastore[0] == ds.ref && r.Snapshot != nil && r.Snapshot.CurrentSnapshot != nil {
			return object.NewVirtualMachine(vc.c, r.Self), r.Snapshot.CurrentSnapshot, nil
		}
	}
	name := cid + replicaSep + ds.ref.Value
	folder, err := d.folder(ctx, vc, d.cfg.dc().TemplateFolder)
	if err != nil {
		return nil, nil, err
	}
	src := object.NewVirtualMachine(vc.c, all[0].Self)
	spec := types.VirtualMachineCloneSpec{Location: types.VirtualMachineRelocateSpec{Datastore: &ds.ref, Pool: &c.pool}}
	t, err := src.Clone(ctx, folder, name, spec)
	var res *types.TaskInfo
	if err == nil {
		res, err = t.WaitForResult(ctx)
	}
	if fault.Is(err, &types.DuplicateName{}) {
		return nil, nil, fmt.Errorf("vsphere: stemcell %s is being copied to %s by another call: try again", cid, ds.name)
	}
	if err != nil {
		return nil, nil, d.cloudErr("copy stemcell to "+ds.name, err)
	}
	vm := object.NewVirtualMachine(vc.c, res.Result.(types.ManagedObjectReference))
	if err := d.snapshot(ctx, vm); err != nil {
		d.destroy(context.WithoutCancel(ctx), vm)
		return nil, nil, err
	}
	d.Log.Info("stemcell copied for linked clones", "stemcell", cid, "datastore", ds.name)
	var mvm mo.VirtualMachine
	if err := vm.Properties(ctx, vm.Reference(), []string{"snapshot"}, &mvm); err != nil || mvm.Snapshot == nil {
		return nil, nil, d.cloudErr("read the stemcell copy's snapshot", err)
	}
	return vm, mvm.Snapshot.CurrentSnapshot, nil
}
