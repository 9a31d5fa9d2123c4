package aws

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	ebstypes "github.com/aws/aws-sdk-go-v2/service/ebs/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/driver/stemcellimage"
)

// ebsBlock is the EBS direct API's block size.
const ebsBlock = 512 * 1024

// uploadWorkers is how many blocks are in flight at once.
const uploadWorkers = 8

// CreateStemcell: a light stemcell (cloud_properties.ami[region]) is
// checked and used as is; a heavy one's raw disk image is written into a
// new snapshot through the EBS direct API and registered as an AMI. No
// volume is attached to the CPI's own host, so bin/cpi need not run on EC2;
// ImportImage is not used.
func (d *Driver) CreateStemcell(ctx context.Context, spec driver.StemcellSpec) (string, error) {
	var p stemcellProps
	if err := spec.CloudProps.Decode("stemcell cloud_properties", &p); err != nil {
		return "", err
	}
	if p.KernelID != "" {
		return "", fmt.Errorf("%w: cloud_properties.kernel_id: paravirtual kernels (AKIs) are retired; HVM stemcells boot their own", driver.ErrNotSupported)
	}
	encrypted := d.cfg.Encrypted
	if p.Encrypted != nil {
		encrypted = *p.Encrypted
	}
	kms := firstNonEmpty(p.KMSKeyARN, d.cfg.KMSKeyARN)
	if kms != "" && !encrypted {
		if p.KMSKeyARN != "" {
			return "", driver.Invalid("cloud_properties.kms_key_arn needs encrypted (it is false)")
		}
		kms = ""
	}
	token := uuid.NewString()
	tags := cloudtags.Merge(p.Tags, spec.Tags, map[string]string{tagToken: token})
	if len(p.AMI) > 0 {
		ami := p.AMI[d.cfg.Region]
		if ami == "" {
			return "", driver.Invalid("light stemcell has no AMI for region %s", d.cfg.Region)
		}
		if err := validCID("stemcell", ami); err != nil {
			return "", err
		}
		if _, err := d.image(ctx, ami); err != nil {
			return "", err
		}
		if encrypted {
			// An encrypted copy is ours (delete_stemcell deletes it).
			return d.copyEncrypted(ctx, ami, kms, tags)
		}
		return ami + " light", nil
	}
	snap, err := d.uploadImage(ctx, spec.ImagePath, p.DiskMiB, tags)
	if err != nil {
		return "", err
	}
	ami, err := d.registerImage(ctx, snap, p, tags)
	if err != nil {
		d.Log.Info("deleting the failed stemcell's snapshot", "snapshot", snap)
		if derr := d.DeleteSnapshot(context.WithoutCancel(ctx), snap); derr != nil {
			d.Log.Warn("deleting failed", "snapshot", snap, "err", derr)
		}
		return "", err
	}
	if !encrypted {
		return ami, nil
	}
	copied, err := d.copyEncrypted(ctx, ami, kms, tags)
	// The unencrypted original is not kept, whatever the copy did.
	if derr := d.DeleteStemcell(context.WithoutCancel(ctx), ami); derr != nil {
		d.Log.Warn("deleting the unencrypted image failed", "ami", ami, "err", derr)
	}
	return copied, err
}

// copyEncrypted copies an AMI into an encrypted one (the job's or the
// stemcell's kms_key_arn, else the account's default EBS key), as the
// official CPI does for encrypted stemcells, and waits until it is
// available.
func (d *Driver) copyEncrypted(ctx context.Context, ami, kms string, tags map[string]string) (string, error) {
	in := &ec2.CopyImageInput{SourceImageId: aws.String(ami), SourceRegion: aws.String(d.cfg.Region),
		Name: aws.String(clip.To("runway-encrypted-"+tags[tagToken], 128)), Encrypted: aws.Bool(true),
		ClientToken: aws.String(tags[tagToken])}
	if kms != "" {
		in.KmsKeyId = aws.String(kms)
	}
	out, err := call(ctx, d, "CopyImage", func(ctx context.Context, c *ec2.Client) (*ec2.CopyImageOutput, error) {
		return c.CopyImage(ctx, in)
	})
	if err != nil {
		return "", d.cloudErr("CopyImage "+ami, err)
	}
	copied := aws.ToString(out.ImageId)
	if _, err := call(ctx, d, "CreateTags", func(ctx context.Context, c *ec2.Client) (*ec2.CreateTagsOutput, error) {
		return c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{copied}, Tags: ec2Tags(tags)})
	}); err != nil {
		d.Log.Warn("tagging failed", "ami", copied, "err", err)
	}
	err = d.waitFor(ctx, "image "+copied+" available", func(ctx context.Context) (bool, error) {
		img, err := d.image(ctx, copied)
		if err != nil {
			return false, err
		}
		if img.State == types.ImageStateFailed || img.State == types.ImageStateError {
			return false, fmt.Errorf("encrypted copy %s of %s failed: %s", copied, ami, img.State)
		}
		return img.State == types.ImageStateAvailable, nil
	})
	if err != nil {
		if derr := d.DeleteStemcell(context.WithoutCancel(ctx), copied); derr != nil {
			d.Log.Warn("deleting the failed copy failed", "ami", copied, "err", derr)
		}
		return "", err
	}
	d.Log.Info("encrypted copy made", "ami", copied, "of", ami)
	return copied, nil
}

// image describes one AMI; unknown or deregistered is ErrStemcellNotFound.
func (d *Driver) image(ctx context.Context, ami string) (types.Image, error) {
	return describeOne(ctx, d, "DescribeImages", "image", ami, "InvalidAMIID.", driver.ErrStemcellNotFound, func(ctx context.Context, c *ec2.Client) (*ec2.DescribeImagesOutput, error) {
		return c.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{ami}})
	}, func(out *ec2.DescribeImagesOutput) []types.Image { return out.Images },
		func(img types.Image) (string, bool) {
			return string(img.State), img.State != types.ImageStateAvailable && img.State != types.ImageStatePending
		})
}

// openRaw finds the raw disk in a stemcell image file: a (gzipped) tar
// holding root.img, as BOSH heavy stemcells ship it, or a plain raw disk.
// size is -1 when it cannot be known before reading.
func openRaw(path string) (io.Reader, int64, func(), error) {
	r, size, closeF, err := stemcellimage.Open(path)
	if err != nil {
		return nil, 0, nil, driver.Invalid("stemcell image: %v", err)
	}
	m, h, err := stemcellimage.Member(r, func(name string) bool { return name == "root.img" || strings.HasSuffix(name, "/root.img") })
	if err != nil {
		closeF()
		return nil, 0, nil, driver.Invalid("stemcell image: no root.img in the tar (%v)", err)
	}
	if m == nil {
		return r, size, closeF, nil
	}
	return m, h.Size, closeF, nil
}

// uploadImage writes the raw disk into a new snapshot, skipping zero
// blocks, and returns the snapshot id once EBS reports it completed.
func (d *Driver) uploadImage(ctx context.Context, path string, diskMiB int, tags map[string]string) (string, error) {
	r, size, closeF, err := openRaw(path)
	if err != nil {
		return "", err
	}
	defer closeF()
	gib := int64(mibToGiB(diskMiB))
	if size >= 0 {
		gib = max(gib, (size+1<<30-1)>>30)
	} else if diskMiB <= 0 {
		return "", driver.Invalid("stemcell image size is unknown (compressed raw disk): set stemcell cloud_properties.disk (MiB)")
	}
	_, eb, err := d.clients(ctx)
	if err != nil {
		return "", err
	}
	var etags []ebstypes.Tag
	for _, t := range ec2Tags(tags) {
		etags = append(etags, ebstypes.Tag{Key: t.Key, Value: t.Value})
	}
	// EBS honours the ClientToken; emulators may not: either way one
	// snapshot survives a resend.
	snap, err := d.createTagged(ctx, "StartSnapshot", tags[tagToken], d.snapshots(), func(ctx context.Context, _ *ec2.Client) (string, error) {
		out, err := eb.StartSnapshot(ctx, &ebs.StartSnapshotInput{VolumeSize: aws.Int64(gib), Tags: etags,
			ClientToken: aws.String(tags[tagToken]), Description: aws.String("runway stemcell")})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.SnapshotId), nil
	})
	if err != nil {
		return "", d.cloudErr("StartSnapshot", err)
	}
	fail := func(err error) (string, error) {
		if derr := d.DeleteSnapshot(context.WithoutCancel(ctx), snap); derr != nil {
			d.Log.Warn("deleting a partial snapshot failed", "snapshot", snap, "err", derr)
		}
		return "", err
	}
	blocks, err := d.putBlocks(ctx, eb, snap, r, gib<<30)
	if err != nil {
		return fail(err)
	}
	if err := d.Retry.Do(ctx, "aws CompleteSnapshot", func(ctx context.Context) error {
		_, err := eb.CompleteSnapshot(ctx, &ebs.CompleteSnapshotInput{SnapshotId: aws.String(snap), ChangedBlocksCount: aws.Int32(int32(blocks))})
		return err
	}); err != nil {
		return fail(d.cloudErr("CompleteSnapshot "+snap, err))
	}
	if err := d.waitSnapshot(ctx, snap); err != nil {
		return fail(err)
	}
	d.Log.Info("stemcell uploaded", "snapshot", snap, "gib", gib, "blocks_written", blocks)
	return snap, nil
}

// putBlocks streams r into the snapshot in 512 KiB blocks, in parallel.
func (d *Driver) putBlocks(ctx context.Context, eb *ebs.Client, snap string, r io.Reader, limit int64) (int, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type block struct {
		idx  int32
		data []byte
	}
	work := make(chan block)
	var wg sync.WaitGroup
	for range uploadWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				sum := sha256.Sum256(b.data)
				err := d.Retry.Do(ctx, "aws PutSnapshotBlock", func(ctx context.Context) error {
					_, err := eb.PutSnapshotBlock(ctx, &ebs.PutSnapshotBlockInput{SnapshotId: aws.String(snap),
						BlockIndex: aws.Int32(b.idx), BlockData: bytes.NewReader(b.data), DataLength: aws.Int32(ebsBlock),
						Checksum: aws.String(base64.StdEncoding.EncodeToString(sum[:])), ChecksumAlgorithm: ebstypes.ChecksumAlgorithmChecksumAlgorithmSha256})
					return err
				})
				if err != nil {
					cancel(d.cloudErr(fmt.Sprintf("PutSnapshotBlock %s #%d", snap, b.idx), err))
				}
			}
		}()
	}
	written := 0
	var readErr error
	var off int64
	for idx := int32(0); ; idx++ {
		buf := make([]byte, ebsBlock)
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if off+int64(n) > limit {
				readErr = driver.Invalid("stemcell image is larger than its %d GiB disk", limit>>30)
				break
			}
			if !allZero(buf[:n]) {
				select {
				case work <- block{idx, buf}:
					written++
				case <-ctx.Done():
				}
			}
			off += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			readErr = driver.Invalid("reading stemcell image: %v", err)
			break
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	if readErr != nil {
		return 0, readErr
	}
	if err := context.Cause(ctx); err != nil {
		return 0, err
	}
	return written, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// registerImage makes an HVM AMI booting from the snapshot. The AMI name is
// unique per call: a retried RegisterImage that already happened answers
// "duplicate name", and the existing image is used.
func (d *Driver) registerImage(ctx context.Context, snap string, p stemcellProps, tags map[string]string) (string, error) {
	name := "runway-" + tags[tagToken]
	if p.Name != "" {
		name = fmt.Sprintf("%s-%s-%s", p.Name, p.Version, tags[tagToken][:8])
	}
	root := firstNonEmpty(p.RootDeviceName, "/dev/xvda")
	in := &ec2.RegisterImageInput{
		Name: aws.String(clip.To(name, 128)), Architecture: types.ArchitectureValues(firstNonEmpty(p.Architecture, "x86_64")),
		RootDeviceName: aws.String(root), VirtualizationType: aws.String(firstNonEmpty(p.VirtualizationType, "hvm")),
		EnaSupport: aws.Bool(true), SriovNetSupport: aws.String("simple"),
		BlockDeviceMappings: []types.BlockDeviceMapping{{DeviceName: aws.String(root),
			Ebs: &types.EbsBlockDevice{SnapshotId: aws.String(snap), DeleteOnTermination: aws.Bool(true), VolumeType: types.VolumeTypeGp3}}},
		TagSpecifications: []types.TagSpecification{tagSpec(types.ResourceTypeImage, cloudtags.Merge(tags, map[string]string{tagSnapshot: snap}))},
	}
	if p.BootMode != "" {
		in.BootMode = types.BootModeValues(p.BootMode)
	}
	out, err := call(ctx, d, "RegisterImage", func(ctx context.Context, c *ec2.Client) (*ec2.RegisterImageOutput, error) {
		return c.RegisterImage(ctx, in)
	})
	if errCode(err) == "InvalidAMIName.Duplicate" {
		found, ferr := call(ctx, d, "DescribeImages", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeImagesOutput, error) {
			return c.DescribeImages(ctx, &ec2.DescribeImagesInput{Owners: []string{"self"},
				Filters: []types.Filter{{Name: aws.String("name"), Values: []string{*in.Name}}}})
		})
		if ferr == nil && len(found.Images) == 1 {
			return aws.ToString(found.Images[0].ImageId), nil
		}
	}
	if err != nil {
		return "", d.cloudErr("RegisterImage", err)
	}
	ami := aws.ToString(out.ImageId)
	// Tag again explicitly: some EC2-compatible APIs (moto among them)
	// ignore RegisterImage's TagSpecifications, and the snapshot tag is
	// how delete_stemcell finds what it uploaded.
	itags := cloudtags.Merge(tags, map[string]string{tagSnapshot: snap})
	if _, err := call(ctx, d, "CreateTags", func(ctx context.Context, c *ec2.Client) (*ec2.CreateTagsOutput, error) {
		return c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{ami}, Tags: ec2Tags(itags)})
	}); err != nil {
		d.Log.Warn("tagging failed", "ami", ami, "err", err)
	}
	d.Log.Info("image registered", "ami", ami, "name", *in.Name, "snapshot", snap)
	return ami, nil
}

// DeleteStemcell deregisters the AMI and deletes its snapshots. Light
// stemcells are not ours: nothing is deleted. Already gone: no error.
func (d *Driver) DeleteStemcell(ctx context.Context, cid string) error {
	if err := validCID("stemcell", cid); err != nil {
		return err
	}
	if strings.HasSuffix(cid, " light") {
		d.Log.Info("light stemcell: the AMI is not ours to delete", "stemcell", cid)
		return nil
	}
	img, err := d.image(ctx, cid)
	if errors.Is(err, driver.ErrStemcellNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := call(ctx, d, "DeregisterImage", func(ctx context.Context, c *ec2.Client) (*ec2.DeregisterImageOutput, error) {
		return c.DeregisterImage(ctx, &ec2.DeregisterImageInput{ImageId: aws.String(cid)})
	}); err != nil && !strings.HasPrefix(errCode(err), "InvalidAMIID.") {
		return d.cloudErr("DeregisterImage "+cid, err)
	}
	snaps := map[string]bool{}
	if s := tagMap(img.Tags)[tagSnapshot]; s != "" {
		snaps[s] = true
	}
	for _, m := range img.BlockDeviceMappings {
		if m.Ebs != nil && aws.ToString(m.Ebs.SnapshotId) != "" {
			snaps[aws.ToString(m.Ebs.SnapshotId)] = true
		}
	}
	for s := range snaps {
		if err := d.DeleteSnapshot(ctx, s); err != nil {
			return err
		}
	}
	return nil
}
