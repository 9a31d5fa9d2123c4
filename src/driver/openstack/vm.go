package openstack

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
)

// Server metadata keys the driver owns.
const (
	mdVM    = "runway_vm"    // the name create_vm gave the server (it may be renamed later)
	mdAgent = "agent_id"     // also a creator tag; read back by ListVMs
	mdPorts = "runway_ports" // "1": runway made ports for this server
	// mdNetworks maps each BOSH network to its Neutron network id
	// (cloudtags.EncodeNames), for list_vms.
	mdNetworks = "runway_networks"
	// mdDirector is the CPI service's creator tag for the director uuid.
	mdDirector = "director"
)

// DeleteVM deletes the server, waits until it is gone, then deletes the
// ports runway made for it and any unbound ones its agent left behind.
func (d *Driver) DeleteVM(ctx context.Context, cid string) (err error) {
	id, err := validCID("vm", cid)
	if err != nil {
		return err
	}
	defer func() {
		if err == nil || errors.Is(err, driver.ErrVMNotFound) {
			_ = d.Locks.Forget(ctx, vmLock(id)) // its attach lock, if it ever had one
		}
	}()
	s, err := d.server(ctx, id)
	if err != nil {
		return err
	}
	// Memberships first, as the official CPI does; if they cannot be
	// removed the server stays, so a retried delete_vm removes both.
	if err := d.leavePools(ctx, s.Metadata); err != nil {
		return err
	}
	if err := d.deleteServer(ctx, id); err != nil {
		return err
	}
	if s.Metadata[mdPorts] != "" || s.Metadata[mdAgent] != "" {
		d.deletePorts(ctx, s)
	}
	return nil
}

func (d *Driver) deleteServer(ctx context.Context, id string) error {
	if err := d.sendDelete(ctx, id); err != nil {
		return err
	}
	err := d.awaitServerGone(ctx, id)
	if err == nil {
		d.Log.Info("server deleted", "server", id)
	}
	return err
}

func (d *Driver) sendDelete(ctx context.Context, id string) error {
	err := d.doOnce(ctx, "compute", "delete server "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return servers.Delete(ctx, sc, id).ExtractErr()
	}, isNotFound)
	if isNotFound(err) {
		return fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.cloudErr("delete server "+id, err)
	}
	return nil
}

// maxDeleteResends bounds how often a delete Nova dropped is sent again.
const maxDeleteResends = 3

// awaitServerGone waits until server id is gone. Nova leaves a server
// ERROR when its delete fails half-way (Neutron failing to release its
// ports, say) and deletes it no further: such a delete is sent again.
func (d *Driver) awaitServerGone(ctx context.Context, id string) error {
	resends := 0
	return d.waitFor(ctx, "server "+id+" gone", func(ctx context.Context) (bool, error) {
		s, err := d.server(ctx, id)
		if errors.Is(err, driver.ErrVMNotFound) {
			return true, nil
		}
		if err != nil || s.Status != "ERROR" || s.TaskState == "deleting" || resends >= maxDeleteResends {
			return false, err
		}
		resends++
		d.Log.Info("the server's delete failed in Nova; sending it again", "server", id, "fault", s.Fault.Message, "resend", resends)
		err = d.sendDelete(ctx, id)
		return errors.Is(err, driver.ErrVMNotFound), ignore(err, driver.ErrVMNotFound)
	})
}

// ignore is err unless it is target.
func ignore(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return err
}

// humanName is the name human_readable_vm_names gives a server: the
// instance name, else job/index, else compiling/<package>.
func humanName(md map[string]string) string {
	switch {
	case md["name"] != "":
		return md["name"]
	case md["job"] != "" && md["index"] != "":
		return md["job"] + "/" + md["index"]
	case md["compiling"] != "":
		return "compiling/" + md["compiling"]
	}
	return ""
}

func vmLock(id string) string { return "openstack-vm-" + id }

// HasVM: deleted and soft-deleted servers count as gone.
func (d *Driver) HasVM(ctx context.Context, cid string) (bool, error) {
	return exists(ctx, "vm", cid, driver.ErrVMNotFound, d.server)
}

// server reads one server; gone (404, DELETED, SOFT_DELETED) is ErrVMNotFound.
func (d *Driver) server(ctx context.Context, id string) (*servers.Server, error) {
	s, err := read(ctx, d, "compute", "get server "+id, fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound),
		func(ctx context.Context, sc *gophercloud.ServiceClient) (*servers.Server, error) {
			return servers.Get(ctx, sc, id).Extract()
		})
	if err != nil {
		return nil, err
	}
	if s.Status == "DELETED" || s.Status == "SOFT_DELETED" {
		return s, fmt.Errorf("server %s is %s: %w", id, s.Status, driver.ErrVMNotFound)
	}
	return s, nil
}

// serversNamed lists the servers named exactly name (Nova matches names
// by regular expression).
func serversNamed(ctx context.Context, sc *gophercloud.ServiceClient, name string) ([]servers.Server, error) {
	return all(ctx, servers.List(sc, servers.ListOpts{Name: "^" + name + "$"}), servers.ExtractServers)
}

var errServerFailed = errors.New("server went to ERROR")

// waitServer polls until the server reaches want; ERROR (with Nova's
// fault) or disappearing ends the wait.
func (d *Driver) waitServer(ctx context.Context, id, want string) (*servers.Server, error) {
	var srv *servers.Server
	err := d.waitFor(ctx, "server "+id+" "+want, func(ctx context.Context) (bool, error) {
		s, err := d.server(ctx, id)
		if err != nil {
			return false, err
		}
		srv = s
		switch s.Status {
		case want:
			return true, nil
		case "ERROR":
			msg := s.Fault.Message
			if msg == "" {
				msg = "no fault given"
			}
			return false, fmt.Errorf("%w: %s: %s", errServerFailed, id, msg)
		}
		return false, nil
	})
	return srv, err
}

// SetVMMetadata merges md into the server's metadata (clipped to Nova's
// limits) and, with human_readable_vm_names, renames the server after it.
func (d *Driver) SetVMMetadata(ctx context.Context, cid string, md map[string]string) (err error) {
	id, err := validCID("vm", cid)
	if err != nil {
		return err
	}
	unlock, err := d.Locks.Lock(ctx, vmLock(id))
	if err != nil {
		return err
	}
	defer func() { d.Locks.Release(vmLock(id), unlock, errors.Is(err, driver.ErrVMNotFound)) }()
	clean := metadata(md)
	for _, k := range []string{mdVM, mdToken, mdPorts, mdNetworks} {
		delete(clean, k) // the driver's own keys are not the caller's to change
	}
	for k := range clean {
		if strings.HasPrefix(k, mdPoolPrefix) {
			delete(clean, k) // delete_vm reads the memberships back
		}
	}
	_, err = d.do(ctx, "compute", "update metadata of "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := servers.UpdateMetadata(ctx, sc, id, servers.MetadataOpts(clean)).Extract()
		return err
	})
	if isNotFound(err) {
		return fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.cloudErr("update metadata of "+id, err)
	}
	name := humanName(md)
	if !d.cfg.HumanReadableVMNames || name == "" {
		return nil
	}
	_, err = d.do(ctx, "compute", "rename "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := servers.Update(ctx, sc, id, servers.UpdateOpts{Name: clip.To(name, 255)}).Extract()
		return err
	})
	if err != nil {
		return d.cloudErr("rename "+id, err)
	}
	return nil
}

// ListVMs finds servers carrying every tag in match (Nova's tag filter),
// with their addresses under the BOSH network names create_vm was given.
func (d *Driver) ListVMs(ctx context.Context, match map[string]string) ([]driver.VMInfo, error) {
	tags := serverTags(match)
	sort.Strings(tags)
	list, err := read(ctx, d, "compute", "list servers", nil, func(ctx context.Context, sc *gophercloud.ServiceClient) ([]servers.Server, error) {
		return all(ctx, servers.List(sc, servers.ListOpts{Tags: strings.Join(tags, ",")}), servers.ExtractServers)
	})
	if err != nil {
		return nil, err
	}
	var netNames map[string]string // Neutron id → name, read once when needed
	var out []driver.VMInfo
	for _, s := range list {
		if s.Status == "DELETED" || s.Status == "SOFT_DELETED" {
			continue
		}
		state := "unknown"
		switch s.Status {
		case "ACTIVE", "BUILD", "REBOOT", "HARD_REBOOT":
			state = "running"
		case "SHUTOFF", "STOPPED", "SUSPENDED", "PAUSED", "SHELVED", "SHELVED_OFFLOADED":
			state = "stopped"
		case "ERROR":
			state = "error"
		}
		tagMap := map[string]string{}
		if s.Tags != nil {
			for _, t := range *s.Tags {
				if k, v, ok := strings.Cut(t, tagSep); ok {
					tagMap[k] = v
				}
			}
		}
		info := driver.VMInfo{CID: s.ID, AgentID: s.Metadata[mdAgent], Tags: tagMap, Metadata: s.Metadata, State: state}
		if bosh := cloudtags.DecodeNames(s.Metadata[mdNetworks]); len(bosh) > 0 {
			if netNames == nil {
				if netNames, err = d.networkNames(ctx); err != nil {
					return nil, err
				}
			}
			info.Networks = driver.Networks{}
			for name, id := range bosh {
				if ip := fixedAddress(&s, netNames[id]); ip != "" {
					info.Networks[name] = driver.Network{IP: ip}
				}
			}
		}
		out = append(out, info)
	}
	return out, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// sweepServers deletes every server named name with this call's token,
// except keep, and waits until they are gone.
func (d *Driver) sweepServers(ctx context.Context, name, token, keep string) {
	sweep(ctx, d, "compute", "list servers named "+name, "server", token, keep,
		func(ctx context.Context, sc *gophercloud.ServiceClient) ([]servers.Server, error) {
			return serversNamed(ctx, sc, name)
		},
		func(s servers.Server) (string, map[string]string) { return s.ID, s.Metadata }, d.deleteServer, driver.ErrVMNotFound)
}
