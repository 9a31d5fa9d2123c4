package aws

import (
	"context"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
)

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
	var ids []string
	for _, s := range out.Snapshots {
		ids = append(ids, aws.ToString(s.SnapshotId))
	}
	return ids, nil
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
