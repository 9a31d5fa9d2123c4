package forge

import (
	"runtime/debug"
	"sync"
)

// UserAgent names Runway and its version in every request to a forge
// (GitHub asks for a User-Agent naming the client; ARC and actions/scaleset
// name theirs): "runway/<version>", the version the module's (a tagged
// build) or its commit's, else "devel".
var UserAgent = sync.OnceValue(func() string { return "runway/" + version() })

func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "devel-" + s.Value[:12]
		}
	}
	return "devel"
}
