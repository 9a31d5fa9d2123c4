package main

import (
	"archive/tar"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// scripts/image twice from the same tree: the same digest; the image
// runs runway as a non-root user and holds what Runway on Kubernetes
// runs — bin/cpi and its Kubernetes driver — and the CA certificates,
// no other executable (another driver is built for nothing).
func TestImageIsReproducible(t *testing.T) {
	dir := t.TempDir()
	var digests []string
	for _, out := range []string{"a.tar", "b.tar"} {
		cmd := exec.Command("../../../scripts/image", "-o", filepath.Join(dir, out))
		cmd.Env = append(cmd.Environ(), "SOURCE_DATE_EPOCH=1764000000")
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("scripts/image: %v", err)
		}
		digests = append(digests, strings.TrimSpace(string(b)))
	}
	if digests[0] != digests[1] || !strings.HasPrefix(digests[0], "sha256:") {
		t.Fatalf("two builds: %q", digests)
	}
	img, err := tarball.ImageFromPath(filepath.Join(dir, "a.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := tarball.ImageFromPath(filepath.Join(dir, "b.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The archive keeps the config and layers (docker's manifest is made
	// anew on reading): they are the same bytes too.
	if a, b := must(img.ConfigName()), must(other.ConfigName()); a != b {
		t.Errorf("the two archives' configs: %s and %s", a, b)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || cf.Config.Entrypoint[0] != "/usr/local/bin/runway" || cf.Created.Unix() != 1764000000 {
		t.Errorf("config: user %q, entrypoint %v, created %v", cf.Config.User, cf.Config.Entrypoint, cf.Created)
	}
	layers, _ := img.Layers()
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1 on an empty base", len(layers))
	}
	rc, _ := layers[0].Uncompressed()
	defer rc.Close()
	tr := tar.NewReader(rc)
	have := entries(t, tr)
	for _, want := range []string{"usr/local/bin/runway", "usr/local/bin/cpi", "usr/local/bin/cpi-kubernetes",
		"etc/ssl/certs/ca-certificates.crt", "etc/passwd"} {
		if !have[want] {
			t.Errorf("the image lacks %s", want)
		}
	}
	for name := range have {
		if exe, ok := strings.CutPrefix(name, "usr/local/bin/"); ok && exe != "" && !slices.Contains([]string{"runway", "cpi", "cpi-kubernetes"}, exe) {
			t.Errorf("the image holds %s, which Runway on Kubernetes does not run", name)
		}
	}
}

// scripts/image -runner twice: the same digest; a non-root user, the
// runner as its entrypoint and a static busybox's /bin/sh for the
// bootstrap.
func TestRunnerImageIsReproducible(t *testing.T) {
	dir := t.TempDir()
	var digests []string
	for _, out := range []string{"a.tar", "b.tar"} {
		cmd := exec.Command("../../../scripts/image", "-runner", "-o", filepath.Join(dir, out))
		cmd.Env = append(cmd.Environ(), "SOURCE_DATE_EPOCH=1764000000")
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("scripts/image -runner: %v", err)
		}
		digests = append(digests, strings.TrimSpace(string(b)))
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds: %q", digests)
	}
	img, err := tarball.ImageFromPath(filepath.Join(dir, "a.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "1000:1000" || cf.Config.Entrypoint[0] != "/usr/local/bin/runner" {
		t.Errorf("config: user %q, entrypoint %v", cf.Config.User, cf.Config.Entrypoint)
	}
	layers, _ := img.Layers()
	rc, _ := layers[0].Uncompressed()
	defer rc.Close()
	have := entries(t, tar.NewReader(rc))
	for _, want := range []string{"usr/local/bin/runner", "bin/busybox", "bin/sh", "etc/passwd", "tmp/"} {
		if !have[want] {
			t.Errorf("the runner image lacks %s", want)
		}
	}
}

func entries(t *testing.T, tr *tar.Reader) map[string]bool {
	have := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return have
		} else if err != nil {
			t.Fatal(err)
		}
		have[h.Name] = true
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
