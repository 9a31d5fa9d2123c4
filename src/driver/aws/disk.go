package aws

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/driver/found"
)

// CreateDisk makes a gp3 (by default) volume in the VM's availability
// zone, tagged with the creator, and waits until it is available.
func (d *Driver) CreateDisk(ctx context.Context, spec driver.DiskSpec) (string, error) {
	var p volumeProps
	if err := spec.Decode(&p); err != nil {
		return "", err
	}
	az, err := d.diskZone(ctx, spec.VMCID, p.AvailabilityZone)
	if err != nil {
		return "", err
	}
	token := uuid.NewString()
	// The disk's own tags (cloud_properties.tags), then the creator's.
	tags := cloudtags.Merge(p.Tags, spec.Tags, map[string]string{tagToken: token})
	in := &ec2.CreateVolumeInput{
		AvailabilityZone: aws.String(az), Size: aws.Int32(mibToGiB(spec.SizeMiB)),
		VolumeType: types.VolumeType(firstNonEmpty(p.Type, "gp3")), ClientToken: aws.String(token),
		TagSpecifications: []types.TagSpecification{tagSpec(types.ResourceTypeVolume, tags)},
		Encrypted:         p.Encrypted,
	}
	if p.Iops > 0 {
		in.Iops = aws.Int32(p.Iops)
	}
	if p.Throughput > 0 {
		in.Throughput = aws.Int32(p.Throughput)
	}
	if p.KMSKeyARN != "" {
		in.KmsKeyId = aws.String(p.KMSKeyARN)
		in.Encrypted = aws.Bool(true)
	} else if p.Encrypted == nil && d.cfg.Encrypted {
		in.Encrypted = aws.Bool(true)
		if d.cfg.KMSKeyARN != "" {
			in.KmsKeyId = aws.String(d.cfg.KMSKeyARN)
		}
	}
	id, err := d.createTagged(ctx, "CreateVolume", token, d.volumes(), func(ctx context.Context, c *ec2.Client) (string, error) {
		out, err := c.CreateVolume(ctx, in)
		if err != nil {
			return "", err
		}
		return aws.ToString(out.VolumeId), nil
	})
	if err != nil {
		return "", d.cloudErr("CreateVolume", err)
	}
	if err := d.waitVolume(ctx, id, func(v types.Volume) (bool, error) {
		switch v.State {
		case types.VolumeStateAvailable:
			return true, nil
		case types.VolumeStateError:
			return false, fmt.Errorf("volume %s went to state error", id)
		}
		return false, nil
	}); err != nil {
		d.sweepToken(context.WithoutCancel(ctx), d.volumes(), token, "")
		return "", err
	}
	d.Log.Info("volume created", "volume", id, "gib", *in.Size, "type", in.VolumeType, "zone", az)
	return id, nil
}

// diskZone: the VM's zone, else the cloud property, else the configured
// default, else the region's first available zone.
func (d *Driver) diskZone(ctx context.Context, vmCID, prop string) (string, error) {
	if vmCID != "" {
		i, err := d.instance(ctx, vmCID)
		if err != nil {
			return "", err
		}
		if i.Placement != nil && aws.ToString(i.Placement.AvailabilityZone) != "" {
			return aws.ToString(i.Placement.AvailabilityZone), nil
		}
	}
	if z := firstNonEmpty(prop, d.cfg.DefaultAvailabilityZone); z != "" {
		return z, nil
	}
	out, err := call(ctx, d, "DescribeAvailabilityZones", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeAvailabilityZonesOutput, error) {
		return c.DescribeAvailabilityZones(ctx, &ec2.DescribeAvailabilityZonesInput{
			Filters: []types.Filter{{Name: aws.String("state"), Values: []string{"available"}}}})
	})
	if err != nil {
		return "", d.cloudErr("DescribeAvailabilityZones", err)
	}
	if len(out.AvailabilityZones) == 0 {
		return "", fmt.Errorf("aws: region %s has no available zone", d.cfg.Region)
	}
	return aws.ToString(out.AvailabilityZones[0].ZoneName), nil
}

// volumesOfToken lists the volumes a create call tagged with token.
func (d *Driver) volumesOfToken(ctx context.Context, c *ec2.Client, token string) ([]string, error) {
	out, err := c.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{Filters: tagFilters(map[string]string{tagToken: token})})
	if err != nil {
		return nil, err
	}
	return idsOf(out.Volumes, func(v types.Volume) *string { return v.VolumeId }), nil
}

// volume describes one volume; unknown or deleted is ErrDiskNotFound.
func (d *Driver) volume(ctx context.Context, id string) (types.Volume, error) {
	if err := validCID("disk", id); err != nil {
		return types.Volume{}, err
	}
	return describeOne(ctx, d, "DescribeVolumes", "volume", id, "InvalidVolume.", driver.ErrDiskNotFound, func(ctx context.Context, c *ec2.Client) (*ec2.DescribeVolumesOutput, error) {
		return c.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{VolumeIds: []string{id}})
	}, func(out *ec2.DescribeVolumesOutput) []types.Volume { return out.Volumes },
		func(v types.Volume) (string, bool) {
			return string(v.State), v.State == types.VolumeStateDeleting || v.State == types.VolumeStateDeleted
		})
}

func (d *Driver) waitVolume(ctx context.Context, id string, done func(types.Volume) (bool, error)) error {
	return d.waitFor(ctx, "volume "+id, func(ctx context.Context) (bool, error) {
		v, err := d.volume(ctx, id)
		if err != nil {
			return false, err
		}
		return done(v)
	})
}

// DeleteDisk deletes the volume, waiting out the moments after a detach
// when EC2 still reports it in use, and waits until it is gone.
func (d *Driver) DeleteDisk(ctx context.Context, cid string) error {
	if _, err := d.volume(ctx, cid); err != nil {
		return err
	}
	return d.deleteVolume(ctx, cid)
}

func (d *Driver) deleteVolume(ctx context.Context, id string) error {
	err := d.waitFor(ctx, "volume "+id+" to be deletable", func(ctx context.Context) (bool, error) {
		_, err := call(ctx, d, "DeleteVolume", func(ctx context.Context, c *ec2.Client) (*ec2.DeleteVolumeOutput, error) {
			return c.DeleteVolume(ctx, &ec2.DeleteVolumeInput{VolumeId: aws.String(id)})
		})
		switch code := errCode(err); {
		case err == nil, strings.HasPrefix(code, "InvalidVolume."):
			return true, nil
		case code == "VolumeInUse":
			d.Log.Info("volume still in use; waiting", "volume", id)
			return false, nil
		default:
			return false, d.cloudErr("DeleteVolume "+id, err)
		}
	})
	if err != nil {
		return err
	}
	return d.waitFor(ctx, "volume "+id+" deleted", func(ctx context.Context) (bool, error) {
		_, err := d.volume(ctx, id)
		if errors.Is(err, driver.ErrDiskNotFound) {
			return true, nil
		}
		return false, err
	})
}

// HasDisk: deleting and deleted volumes count as gone.
func (d *Driver) HasDisk(ctx context.Context, cid string) (bool, error) {
	_, err := d.volume(ctx, cid)
	return found.Answer(err, driver.ErrDiskNotFound)
}

// ResizeDisk grows a volume in place (ModifyVolume); EBS cannot shrink.
func (d *Driver) ResizeDisk(ctx context.Context, cid string, sizeMiB int) error {
	_, err := d.modifyVolume(ctx, cid, sizeMiB, nil)
	return err
}

// UpdateDisk changes size, type, IOPS and throughput in place, as EBS
// Elastic Volumes allow; encryption, key and zone cannot change.
func (d *Driver) UpdateDisk(ctx context.Context, cid string, sizeMiB int, props driver.Props) (string, error) {
	var p volumeProps
	if err := props.Decode("cloud_properties", &p); err != nil {
		return "", err
	}
	return d.modifyVolume(ctx, cid, sizeMiB, &p)
}

func (d *Driver) modifyVolume(ctx context.Context, cid string, sizeMiB int, p *volumeProps) (string, error) {
	v, err := d.volume(ctx, cid)
	if err != nil {
		return "", err
	}
	cur := aws.ToInt32(v.Size)
	in := &ec2.ModifyVolumeInput{VolumeId: aws.String(cid)}
	changed := false
	if sizeMiB > 0 {
		want := mibToGiB(sizeMiB)
		if want < cur {
			return "", fmt.Errorf("volume %s is %d GiB; EBS cannot shrink it to %d GiB: %w", cid, cur, want, driver.ErrNotSupported)
		}
		if want > cur {
			in.Size, changed = aws.Int32(want), true
		}
	}
	if p != nil {
		if p.Encrypted != nil && *p.Encrypted != aws.ToBool(v.Encrypted) || p.KMSKeyARN != "" && p.KMSKeyARN != aws.ToString(v.KmsKeyId) {
			return "", fmt.Errorf("volume %s: encryption cannot change in place: %w", cid, driver.ErrNotSupported)
		}
		if p.AvailabilityZone != "" && p.AvailabilityZone != aws.ToString(v.AvailabilityZone) {
			return "", fmt.Errorf("volume %s: availability zone cannot change in place: %w", cid, driver.ErrNotSupported)
		}
		if p.Type != "" && types.VolumeType(p.Type) != v.VolumeType {
			in.VolumeType, changed = types.VolumeType(p.Type), true
		}
		if p.Iops > 0 && p.Iops != aws.ToInt32(v.Iops) {
			in.Iops, changed = aws.Int32(p.Iops), true
		}
		if p.Throughput > 0 && p.Throughput != aws.ToInt32(v.Throughput) {
			in.Throughput, changed = aws.Int32(p.Throughput), true
		}
	}
	if !changed {
		return cid, nil
	}
	if _, err := call(ctx, d, "ModifyVolume", func(ctx context.Context, c *ec2.Client) (*ec2.ModifyVolumeOutput, error) {
		return c.ModifyVolume(ctx, in)
	}); err != nil {
		// A retried modify may have happened the first time.
		if v, verr := d.volume(ctx, cid); verr != nil || in.Size == nil || aws.ToInt32(v.Size) != *in.Size {
			return "", d.cloudErr("ModifyVolume "+cid, err)
		}
	}
	if in.Size != nil {
		if err := d.waitVolume(ctx, cid, func(v types.Volume) (bool, error) { return aws.ToInt32(v.Size) >= *in.Size, nil }); err != nil {
			return "", err
		}
	}
	d.Log.Info("volume modified", "volume", cid)
	return cid, nil
}

func (d *Driver) SetDiskMetadata(ctx context.Context, cid string, md map[string]string) error {
	if err := validCID("disk", cid); err != nil {
		return err
	}
	if len(md) == 0 {
		_, err := d.volume(ctx, cid)
		return err
	}
	_, err := call(ctx, d, "CreateTags", func(ctx context.Context, c *ec2.Client) (*ec2.CreateTagsOutput, error) {
		return c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{cid}, Tags: ec2Tags(md)})
	})
	if strings.HasPrefix(errCode(err), "InvalidVolume.") {
		return fmt.Errorf("volume %s: %w", cid, driver.ErrDiskNotFound)
	}
	if err != nil {
		return d.cloudErr("CreateTags "+cid, err)
	}
	return nil
}

// SnapshotDisk snapshots a volume; the snapshot carries the volume's
// creator tags plus the metadata, and the call waits until it completes.
func (d *Driver) SnapshotDisk(ctx context.Context, cid string, md map[string]string) (string, error) {
	v, err := d.volume(ctx, cid)
	if err != nil {
		return "", err
	}
	tags := tagMap(v.Tags)
	delete(tags, tagName)
	token := uuid.NewString()
	tags = cloudtags.Merge(tags, md)
	tags[tagToken] = token
	desc := "runway snapshot of " + cid
	if dep, job := md["deployment"], md["job"]; dep != "" {
		desc = fmt.Sprintf("%s/%s/%s", dep, job, md["index"])
	}
	id, err := d.createTagged(ctx, "CreateSnapshot", token, d.snapshots(), func(ctx context.Context, c *ec2.Client) (string, error) {
		out, err := c.CreateSnapshot(ctx, &ec2.CreateSnapshotInput{VolumeId: aws.String(cid), Description: aws.String(desc),
			TagSpecifications: []types.TagSpecification{tagSpec(types.ResourceTypeSnapshot, tags)}})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.SnapshotId), nil
	})
	if err != nil {
		if strings.HasPrefix(errCode(err), "InvalidVolume.") {
			return "", fmt.Errorf("volume %s: %w", cid, driver.ErrDiskNotFound)
		}
		return "", d.cloudErr("CreateSnapshot "+cid, err)
	}
	if err := d.waitSnapshot(ctx, id); err != nil {
		d.sweepToken(context.WithoutCancel(ctx), d.snapshots(), token, "")
		return "", err
	}
	return id, nil
}

func (d *Driver) waitSnapshot(ctx context.Context, id string) error {
	return d.waitFor(ctx, "snapshot "+id+" completed", func(ctx context.Context) (bool, error) {
		out, err := call(ctx, d, "DescribeSnapshots", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeSnapshotsOutput, error) {
			return c.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: []string{id}})
		})
		if err != nil {
			return false, d.cloudErr("DescribeSnapshots "+id, err)
		}
		for _, s := range out.Snapshots {
			switch s.State {
			case types.SnapshotStateCompleted:
				return true, nil
			case types.SnapshotStateError:
				return false, fmt.Errorf("snapshot %s failed: %s", id, aws.ToString(s.StateMessage))
			}
		}
		return false, nil
	})
}

// snapshotsOfToken lists the snapshots a create call tagged with token.
func (d *Driver) snapshotsOfToken(ctx context.Context, c *ec2.Client, token string) ([]string, error) {
	out, err := c.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{OwnerIds: []string{"self"}, Filters: tagFilters(map[string]string{tagToken: token})})
	if err != nil {
		return nil, err
	}
	return idsOf(out.Snapshots, func(s types.Snapshot) *string { return s.SnapshotId }), nil
}

// idsOf are the ids of what EC2 described.
func idsOf[T any](items []T, id func(T) *string) []string {
	var ids []string
	for _, it := range items {
		ids = append(ids, aws.ToString(id(it)))
	}
	return ids
}

// DeleteSnapshot: a snapshot that is already gone is not an error.
func (d *Driver) DeleteSnapshot(ctx context.Context, cid string) error {
	if err := validCID("snapshot", cid); err != nil {
		return err
	}
	_, err := call(ctx, d, "DeleteSnapshot", func(ctx context.Context, c *ec2.Client) (*ec2.DeleteSnapshotOutput, error) {
		return c.DeleteSnapshot(ctx, &ec2.DeleteSnapshotInput{SnapshotId: aws.String(cid)})
	})
	if err != nil && !strings.HasPrefix(errCode(err), "InvalidSnapshot.") {
		return d.cloudErr("DeleteSnapshot "+cid, err)
	}
	return nil
}
