// Command mkimage builds Runway's container image from executables
// already built: one layer on an empty base holding them in
// /usr/local/bin, the CA certificates, and a non-root user (65532), every
// entry's time the commit's, so the same executables make the same
// digest. With -runner it builds the runner image instead: the runner
// program (/usr/local/bin/runner) beside a static busybox (/bin/sh runs
// the bootstrap), user 1000. It writes a docker-archive tarball (for
// `ctr import`) and can push the image to a registry. scripts/image
// calls it.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// uid is the image's user (and group): not root.
const uid = 65532

func main() {
	bin := flag.String("bin", "bin", "directory of the executables (runway, cpi, cpi-*)")
	cacert := flag.String("cacert", "/etc/ssl/certs/ca-certificates.crt", "the CA certificates bundle")
	epoch := flag.Int64("epoch", 0, "every entry's and the image's time (the commit's, Unix seconds)")
	tag := flag.String("tag", "runway/runway:dev", "the image's name in the tarball")
	out := flag.String("o", "", "write a docker-archive tarball here")
	push := flag.String("push", "", "push to this reference too (plain HTTP: a test registry)")
	runner := flag.Bool("runner", false, "the runner image: bin's runner and busybox")
	busybox := flag.String("busybox", "/bin/busybox", "a static busybox (Debian's busybox-static), for -runner")
	flag.Parse()
	at := time.Unix(*epoch, 0).UTC()
	var img v1.Image
	var err error
	if *runner {
		img, err = buildRunner(*bin, *busybox, at)
	} else {
		img, err = build(*bin, *cacert, at)
	}
	if err == nil {
		err = write(img, *tag, *out, *push)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	d, _ := img.Digest()
	fmt.Println(d)
}

func write(img v1.Image, tag, out, push string) error {
	if out != "" {
		ref, err := name.NewTag(tag)
		if err != nil {
			return err
		}
		if err := tarball.WriteToFile(out, ref, img); err != nil {
			return err
		}
	}
	if push != "" {
		ref, err := name.ParseReference(push, name.Insecure)
		if err != nil {
			return err
		}
		return remote.Write(ref, img)
	}
	return nil
}

// entry is one file of the layer.
type entry struct {
	path string
	mode int64
	uid  int
	body []byte // nil: a directory (or a symlink)
	link string // a symlink's target
}

// build makes the image.
func build(bin, cacert string, at time.Time) (v1.Image, error) {
	exes, err := filepath.Glob(filepath.Join(bin, "*"))
	if err != nil {
		return nil, err
	}
	var files []entry
	for _, p := range exes {
		base := filepath.Base(p)
		if base != "runway" && base != "cpi" && !(len(base) > 4 && base[:4] == "cpi-") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		files = append(files, entry{path: "usr/local/bin/" + base, mode: 0o755, body: b})
	}
	if len(files) == 0 {
		return nil, errors.New("no executables in " + bin)
	}
	certs, err := os.ReadFile(cacert)
	if err != nil {
		return nil, err
	}
	files = append(files,
		entry{path: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, body: certs},
		entry{path: "etc/passwd", mode: 0o644, body: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nrunway:x:%d:%d:runway:/var/lib/runway:/sbin/nologin\n", uid, uid))},
		entry{path: "etc/group", mode: 0o644, body: []byte(fmt.Sprintf("root:x:0:\nrunway:x:%d:\n", uid))},
		entry{path: "tmp", mode: 0o1777},
		entry{path: "var/lib/runway", mode: 0o700, uid: uid},
	)
	return image(files, at, v1.Config{User: fmt.Sprintf("%d:%d", uid, uid), Entrypoint: []string{"/usr/local/bin/runway"}, Cmd: []string{"controller"},
		WorkingDir: "/var/lib/runway", Env: []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		Labels: map[string]string{"org.opencontainers.image.title": "runway"}})
}

// runnerUID is the runner image's user: the Kubernetes driver's default
// run_as_user.
const runnerUID = 1000

// buildRunner makes the runner image: bin/runner, a static busybox and
// its applets at /bin (the bootstrap is a /bin/sh script), a home.
func buildRunner(bin, busybox string, at time.Time) (v1.Image, error) {
	prog, err := os.ReadFile(filepath.Join(bin, "runner"))
	if err != nil {
		return nil, err
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("%w (apt-get install busybox-static)", err)
	}
	if f, err := elf.NewFile(bytes.NewReader(bb)); err != nil || slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		return nil, fmt.Errorf("%s is not a static executable: on an empty base it cannot run (apt-get install busybox-static)", busybox)
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	files := []entry{{path: "usr/local/bin/runner", mode: 0o755, body: prog}, {path: "bin/busybox", mode: 0o755, body: bb},
		{path: "etc/passwd", mode: 0o644, body: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nrunner:x:%d:%d:runner:/home/runner:/bin/sh\n", runnerUID, runnerUID))},
		{path: "etc/group", mode: 0o644, body: []byte(fmt.Sprintf("root:x:0:\nrunner:x:%d:\n", runnerUID))},
		{path: "tmp", mode: 0o1777}, {path: "home/runner", mode: 0o755, uid: runnerUID}}
	for _, a := range strings.Fields(string(list)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			files = append(files, entry{path: "bin/" + a, mode: 0o777, link: "busybox"})
		}
	}
	return image(files, at, v1.Config{User: fmt.Sprintf("%d:%d", runnerUID, runnerUID), Entrypoint: []string{"/usr/local/bin/runner"},
		WorkingDir: "/home/runner", Env: []string{"PATH=/usr/local/bin:/bin", "HOME=/home/runner"},
		Labels: map[string]string{"org.opencontainers.image.title": "runway-runner"}})
}

// image is one layer of files on an empty base, with config c.
func image(files []entry, at time.Time, c v1.Config) (v1.Image, error) {
	layerTar, err := tarOf(files, at)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = "amd64", "linux", v1.Time{Time: at}
	cf.Config = c
	cf.History = nil
	return mutate.ConfigFile(img, cf)
}

// tarOf writes the entries, their parent directories first, sorted, all
// at the same time.
func tarOf(files []entry, at time.Time) ([]byte, error) {
	dirs := map[string]bool{}
	for _, f := range files {
		for d := filepath.Dir(f.path); d != "."; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	all := map[string]entry{}
	for d := range dirs {
		all[d] = entry{path: d, mode: 0o755}
	}
	for _, f := range files {
		all[f.path] = f
	}
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := all[p]
		h := &tar.Header{Name: p, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: at, Format: tar.FormatPAX}
		switch {
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		case f.body == nil:
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
