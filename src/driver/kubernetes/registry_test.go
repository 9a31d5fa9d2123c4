package kubernetes

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/testkit/rootfs"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// devRegistry is the dev cluster's registry: the driver config naming
// the repository heavy stemcells go to, and that repository.
func devRegistry(t *testing.T) (map[string]any, string) {
	repo := testenv.Need(t, "scripts/k8s-dev start (its registry)", "RUNWAY_K8S_REGISTRY")[0]
	// A repository of the test's own: other packages' tests (the
	// orchestrator e2e's runners in pods) push to the shared one at the
	// same time, and these tests count the tags theirs left.
	repo += "/" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	return map[string]any{"registry": map[string]any{"repository": repo, "insecure": true}}, repo
}

// tags lists the repository's tags (none before the first push).
func tags(t *testing.T, repo string) []string {
	t.Helper()
	r, err := name.NewRepository(repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := remote.List(r)
	var te *transport.Error
	if errors.As(err, &te) && te.StatusCode == 404 {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// A rootfs tarball becomes an image in the registry; a pod runs from it
// (its user data as the command, as a runner's bootstrap is); delete_stemcell
// deletes the image again, and only it.
func TestHeavyStemcellRunsFromTheRegistry(t *testing.T) {
	c := devCluster(t)
	reg, repo := devRegistry(t)
	d := newTestDriver(t, c, reg)
	ctx := context.Background()
	img := filepath.Join(t.TempDir(), "image")
	// Device nodes and FIFOs are dropped: the runtime makes /dev.
	if err := rootfs.Write(img, nil,
		rootfs.Entry{Header: tar.Header{Name: "./dev/", Typeflag: tar.TypeDir, Mode: 0o755}},
		rootfs.Entry{Header: tar.Header{Name: "./dev/sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8}},
		rootfs.Entry{Header: tar.Header{Name: "./tmp/fifo", Typeflag: tar.TypeFifo, Mode: 0o666}}); err != nil {
		t.Fatal(err)
	}
	if f := d.StemcellFormats(); !strings.Contains(strings.Join(f, ","), "warden-tar") {
		t.Errorf("stemcell_formats %v with a registry: want warden-tar", f)
	}
	before := len(tags(t, repo))
	manifest := map[string]any{"name": "bosh-warden-boshlite-ubuntu-jammy-go_agent", "version": "1.500", "infrastructure": "warden"}
	sc, err := d.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: img, CloudProps: driver.PropsOf(manifest)})
	if err != nil {
		t.Fatal(err)
	}
	// The same tarball twice: two images, so one delete leaves the other.
	sc2, err := d.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: img, CloudProps: driver.PropsOf(manifest)})
	if err != nil {
		t.Fatal(err)
	}
	if sc == sc2 {
		t.Fatalf("two uploads, one cid %s", sc)
	}
	if n := len(tags(t, repo)); n != before+2 {
		t.Errorf("%d tags after two pushes, want %d", n, before+2)
	}
	ref, err := stemcellImage(sc)
	if err != nil || !strings.HasPrefix(ref, repo+"@sha256:") {
		t.Fatalf("cid %s names %q (%v); want an image of %s by digest", sc, ref, err, repo)
	}

	script := "echo \"user data ran as $(id -u)\"\n[ ! -e /dev/sda ] || echo device-kept\n[ ! -e /tmp/fifo ] || echo fifo-kept\nexec sleep 3600\n"
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "heavy", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{}),
		Env: map[string]any{"user_data": script}})
	if err != nil {
		t.Fatal(err)
	}
	out := c.exec(t, vm.CID, "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; ls -l /var/vcap/bosh/user-data; [ ! -e /dev/sda ] || echo device-kept; [ ! -e /tmp/fifo ] || echo fifo-kept")
	if !strings.Contains(out, "sleep 3600") || strings.Contains(out, "kept") || !strings.Contains(out, "-r-xr-x---") {
		t.Errorf("pod from the pushed image: %q; want the user data's sleep as PID 1, the script 0550, no device or fifo", out)
	}
	// The user data is in the VM's Secret, never in the pod spec.
	pod, _ := c.admin.CoreV1().Pods(c.ns).Get(ctx, vm.CID, metav1.GetOptions{})
	if b, _ := json.Marshal(pod); strings.Contains(string(b), "user data ran") {
		t.Error("the user data is in the pod's spec")
	}
	if err := d.DeleteVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}

	if err := d.DeleteStemcell(ctx, sc); err != nil {
		t.Fatal(err)
	}
	r, _ := name.NewDigest(ref, name.Insecure)
	var te *transport.Error
	if _, err := remote.Head(r); !errors.As(err, &te) || te.StatusCode != 404 {
		t.Errorf("image %s after delete_stemcell: %v; want 404", ref, err)
	}
	if err := d.DeleteStemcell(ctx, sc); err != nil {
		t.Errorf("delete_stemcell again: %v; want nil (gone already)", err)
	}
	ref2, _ := stemcellImage(sc2)
	r2, _ := name.NewDigest(ref2, name.Insecure)
	if _, err := remote.Head(r2); err != nil {
		t.Errorf("the other upload's image %s: %v; want it kept", ref2, err)
	}
	// A cid aimed at another repository of the same registry: refused,
	// nothing deleted.
	other := strings.Replace(ref2, repo+"@", repo+"-other@", 1)
	if other == ref2 {
		t.Fatalf("%s is not an image of %s", ref2, repo)
	}
	if err := d.DeleteStemcell(ctx, pushedPrefix+base64.RawURLEncoding.EncodeToString([]byte(other))); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("delete_stemcell of %s: %v; want ErrInvalidInput", other, err)
	}
	if err := d.DeleteStemcell(ctx, sc2); err != nil {
		t.Fatal(err)
	}
	assertNoneLeft(t, c)
}

// Entries that leave the image's root are refused by name; nothing is
// pushed.
func TestHostileStemcellTarballsAreRefused(t *testing.T) {
	c := devCluster(t)
	reg, repo := devRegistry(t)
	d := newTestDriver(t, c, reg)
	before := len(tags(t, repo))
	for _, tc := range []struct {
		name string
		e    rootfs.Entry
		want string
	}{
		{"dot-dot", rootfs.Entry{Header: tar.Header{Name: "./../../etc/cron.d/evil", Typeflag: tar.TypeReg, Mode: 0o644}, Body: []byte("x")}, "../../etc/cron.d/evil"},
		{"absolute", rootfs.Entry{Header: tar.Header{Name: "/etc/shadow", Typeflag: tar.TypeReg, Mode: 0o644}}, "/etc/shadow"},
		{"hard link out", rootfs.Entry{Header: tar.Header{Name: "./shadow", Typeflag: tar.TypeLink, Linkname: "../../../etc/shadow"}}, "./shadow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "image")
			if err := rootfs.Write(img, nil, tc.e); err != nil {
				t.Fatal(err)
			}
			_, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{ImagePath: img, CloudProps: driver.PropsOf(map[string]any{})})
			if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("create_stemcell: %v; want ErrInvalidInput naming %q", err, tc.want)
			}
		})
	}
	if n := len(tags(t, repo)); n != before {
		t.Errorf("%d tags after refused uploads, want %d", n, before)
	}
	if _, err := os.Stat("/etc/cron.d/evil"); err == nil {
		t.Error("an entry reached the host")
	}
}

// A registry that asks for credentials: create_stemcell and delete_stemcell
// use the configured ones, wrong ones are refused without being repeated,
// and a pod pulls the image only with the VM type's image_pull_secrets.
func TestRegistryWithCredentials(t *testing.T) {
	c := devCluster(t)
	env := testenv.Need(t, "scripts/k8s-dev start (its registry with credentials)",
		"RUNWAY_K8S_AUTH_REGISTRY", "RUNWAY_K8S_AUTH_REGISTRY_USER", "RUNWAY_K8S_AUTH_REGISTRY_PASSWORD")
	repo, user, password := env[0], env[1], env[2]
	ctx := context.Background()
	img := filepath.Join(t.TempDir(), "image")
	if err := rootfs.Write(img, nil); err != nil {
		t.Fatal(err)
	}
	spec := driver.StemcellSpec{ImagePath: img, CloudProps: driver.PropsOf(map[string]any{"name": "runner", "version": "1"})}
	secret := "runway-pull-" + strings.ToLower(t.Name())
	withCreds := func(u, p string) *Driver {
		return newTestDriver(t, c, map[string]any{"registry": map[string]any{
			"repository": repo, "insecure": true, "username": u, "password": p}, "allowed_image_pull_secrets": []string{secret}})
	}

	wrong := "not-" + password
	for name, d := range map[string]*Driver{"anonymous": withCreds("", ""), "a wrong password": withCreds(user, wrong)} {
		_, err := d.CreateStemcell(ctx, spec)
		if err == nil || !strings.Contains(err.Error(), "kubernetes.registry") || !strings.Contains(err.Error(), "401") {
			t.Errorf("create_stemcell, %s: %v; want a kubernetes.registry error with HTTP 401", name, err)
		}
		if err != nil && (strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), password)) {
			t.Errorf("create_stemcell, %s: the error carries the password: %v", name, err)
		}
	}

	d := withCreds(user, password)
	sc, err := d.CreateStemcell(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := stemcellImage(sc)
	if err != nil {
		t.Fatal(err)
	}
	dg, _ := name.NewDigest(ref, name.Insecure)
	basic := remote.WithAuth(&authn.Basic{Username: user, Password: password})
	if _, err := remote.Head(dg, basic); err != nil {
		t.Fatalf("image %s after create_stemcell: %v", ref, err)
	}
	var te *transport.Error
	if _, err := remote.Head(dg); !errors.As(err, &te) || te.StatusCode != 401 {
		t.Errorf("image %s read anonymously: %v; want 401", ref, err)
	}

	// The kubelet pulls with the pod's pull secret, and only with it.
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	host := strings.SplitN(repo, "/", 2)[0]
	cfg, _ := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{"auth": auth}}})
	if _, err := c.admin.CoreV1().Secrets(c.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.admin.CoreV1().Secrets(c.ns).Delete(ctx, secret, metav1.DeleteOptions{}) })
	run := []string{"sleep", "3600"}
	_, err = d.CreateVM(ctx, driver.VMSpec{AgentID: "no-secret", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"command": run})})
	var pf *podFailure
	if !errors.As(err, &pf) || (pf.Reason != "ErrImagePull" && pf.Reason != "ImagePullBackOff") {
		t.Errorf("create_vm without image_pull_secrets: %v; want the pod's ErrImagePull", err)
	}
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "with-secret", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{
		"command": run, "image_pull_secrets": []map[string]string{{"name": secret}}})})
	if err != nil {
		t.Fatalf("create_vm with image_pull_secrets: %v", err)
	}
	if err := d.DeleteVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}

	if err := d.DeleteStemcell(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Head(dg, basic); !errors.As(err, &te) || te.StatusCode != 404 {
		t.Errorf("image %s after delete_stemcell: %v; want 404", ref, err)
	}
	assertNoneLeft(t, c)
}
