package main

import (
	"slices"
	"testing"
)

// What util-linux's mount(8) passes a helper: SOURCE DIR [-sfnv] [-N NS]
// [-o OPTIONS] [-t TYPE].
func TestParseTakesWhatMountPasses(t *testing.T) {
	req, fake, err := parse([]string{"/warden-cpi-dev/disk-1", "/var/vcap/store", "-o", "rw,noatime", "-t", "ext4"})
	if err != nil || fake || req.Source != "/warden-cpi-dev/disk-1" || req.Target != "/var/vcap/store" || !slices.Equal(req.Options, []string{"rw,noatime"}) {
		t.Errorf("%+v %v %v", req, fake, err)
	}
	if _, fake, err := parse([]string{"-fv", "/warden-cpi-dev/disk-1", "/mnt"}); err != nil || !fake {
		t.Errorf("-f: fake %v, %v", fake, err)
	}
	for _, bad := range [][]string{{"/a"}, {"/a", "/b", "/c"}, {"/a", "/b", "-o"}, {"/a", "/b", "-x"}} {
		if _, _, err := parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
