package garm

import (
	"strings"
	"testing"

	"github.com/cloudbase/garm-provider-common/params"

	"github.com/runway-cpi/runway/src/config"
)

func TestUserDataPerDriverAndOS(t *testing.T) {
	tool := func(os, arch string) params.RunnerApplicationDownload {
		return params.RunnerApplicationDownload{OS: &os, Architecture: &arch, DownloadURL: strPtr("https://example/r.tgz"), Filename: strPtr("r.tgz")}
	}
	bi := params.BootstrapInstance{Name: "r-1", MetadataURL: "https://garm/metadata", CallbackURL: "https://garm/callbacks",
		Tools: []params.RunnerApplicationDownload{tool("linux", "x64"), tool("win", "x64")}, OSArch: params.Amd64}
	for _, tc := range []struct {
		driver string
		os     params.OSType
		want   string
	}{
		{"local", params.Linux, "#!/bin/bash"},
		{"kubernetes", params.Linux, "#!/bin/bash"},
		{"openstack", params.Linux, "#cloud-config"},
		{"aws", params.Windows, "#ps1_sysnative"},
	} {
		p := &provider{cfg: &config.Config{Driver: tc.driver}}
		bi.OSType = tc.os
		ud, err := p.userData(bi)
		if err != nil {
			t.Fatalf("%s/%s: %v", tc.driver, tc.os, err)
		}
		if !strings.HasPrefix(ud, tc.want) {
			t.Errorf("%s/%s user data starts %q; want %q", tc.driver, tc.os, ud[:min(40, len(ud))], tc.want)
		}
	}
	bi.OSArch = "sparc"
	if _, err := (&provider{cfg: &config.Config{Driver: "local"}}).userData(bi); err == nil {
		t.Error("an unsupported arch rendered")
	}
}

func strPtr(s string) *string { return &s }
