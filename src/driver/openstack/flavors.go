package openstack

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"

	"github.com/runway-cpi/runway/src/driver"
)

// flavorCacheTTL: flavors change rarely; a stale id is also caught by
// Nova refusing it (create_vm then looks again once).
const flavorCacheTTL = 24 * time.Hour

type flavorEntry struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	VCPUs     int    `json:"vcpus"`
	RAM       int    `json:"ram"`  // MiB
	Disk      int    `json:"disk"` // GiB
	Ephemeral int    `json:"ephemeral"`
}

type flavorCache struct {
	Fetched time.Time     `json:"fetched"`
	Flavors []flavorEntry `json:"flavors"`
}

var errUnknownFlavor = errors.New("unknown flavor")

// flavor resolves a flavor name (or id) from the cache in the state dir,
// listing Nova's flavors only when the cache misses or refresh is asked.
func (d *Driver) flavor(ctx context.Context, nameOrID string, refresh bool) (*flavorEntry, error) {
	if !refresh {
		if c := d.readFlavorCache(); c != nil {
			if f := findFlavor(c.Flavors, nameOrID); f != nil {
				return f, nil
			}
		}
	}
	list, err := d.listFlavors(ctx)
	if err != nil {
		return nil, err
	}
	if f := findFlavor(list, nameOrID); f != nil {
		return f, nil
	}
	names := make([]string, 0, len(list))
	for _, f := range list {
		names = append(names, f.Name)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("openstack (%s): %w: flavor %q not found; this project can use: %s", d.cfg.AuthURL, errUnknownFlavor, nameOrID, strings.Join(names, ", "))
}

func findFlavor(list []flavorEntry, nameOrID string) *flavorEntry {
	for i := range list {
		if list[i].Name == nameOrID {
			return &list[i]
		}
	}
	for i := range list {
		if list[i].ID == nameOrID {
			return &list[i]
		}
	}
	return nil
}

// listFlavors reads every flavor the project may use and refreshes the cache.
func (d *Driver) listFlavors(ctx context.Context) ([]flavorEntry, error) {
	list, err := read(ctx, d, "compute", "list flavors", nil, func(ctx context.Context, sc *gophercloud.ServiceClient) ([]flavors.Flavor, error) {
		return all(ctx, flavors.ListDetail(sc, flavors.ListOpts{AccessType: flavors.AllAccess}), flavors.ExtractFlavors)
	})
	if err != nil {
		return nil, err
	}
	var out []flavorEntry
	for _, f := range list {
		out = append(out, flavorEntry{ID: f.ID, Name: f.Name, VCPUs: f.VCPUs, RAM: f.RAM, Disk: f.Disk, Ephemeral: f.Ephemeral})
	}
	d.writeCache("flavors", "flavor", &flavorCache{Fetched: time.Now(), Flavors: out})
	return out, nil
}

func (d *Driver) readFlavorCache() *flavorCache {
	c := readCache[flavorCache](d, "flavors")
	if c == nil || time.Since(c.Fetched) > flavorCacheTTL {
		return nil
	}
	return c
}

// CalculateVMCloudProperties picks the smallest flavor (RAM, then vCPUs,
// then disk) with enough CPU and RAM whose root disk holds the ephemeral
// disk; when none has the disk, the smallest that fits boots from a
// volume sized for it.
func (d *Driver) CalculateVMCloudProperties(ctx context.Context, r driver.Resources) (driver.Props, error) {
	if r.CPU <= 0 || r.RAM <= 0 || r.EphemeralDiskSize < 0 {
		return driver.Props{}, driver.Invalid("desired_instance_size needs positive cpu and ram, got cpu=%d ram=%d ephemeral_disk_size=%d", r.CPU, r.RAM, r.EphemeralDiskSize)
	}
	list, err := d.listFlavors(ctx)
	if err != nil {
		return driver.Props{}, err
	}
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.RAM != b.RAM {
			return a.RAM < b.RAM
		}
		if a.VCPUs != b.VCPUs {
			return a.VCPUs < b.VCPUs
		}
		return a.Disk < b.Disk
	})
	// BOSH stemcells want ~3 GiB of root besides the ephemeral disk.
	needGiB := mibToGiB(r.EphemeralDiskSize) + 3
	var fits *flavorEntry
	for i := range list {
		f := &list[i]
		if f.VCPUs < r.CPU || f.RAM < r.RAM {
			continue
		}
		if fits == nil {
			fits = f
		}
		if f.Disk >= needGiB || f.Ephemeral*1024 >= r.EphemeralDiskSize && f.Ephemeral > 0 {
			return driver.PropsOf(map[string]any{"instance_type": f.Name}), nil
		}
	}
	if fits == nil {
		return driver.Props{}, fmt.Errorf("openstack (%s): no flavor has %d vCPUs and %d MiB of RAM", d.cfg.AuthURL, r.CPU, r.RAM)
	}
	return driver.PropsOf(map[string]any{"instance_type": fits.Name, "boot_from_volume": true,
		"root_disk": map[string]any{"size": needGiB}}), nil // GiB, the official unit
}
