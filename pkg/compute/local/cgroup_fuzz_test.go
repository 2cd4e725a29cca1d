package local

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzFindCgroupPlace feeds arbitrary mount tables and cgroup files to the
// parsers: they must not panic, and a place they return must be a clean
// absolute directory at or below the cgroup2 mount it names.
func FuzzFindCgroupPlace(f *testing.F) {
	for _, mi := range []string{mountinfoHybrid, mountinfoV2, mountinfoV1, mountinfoContainerRO, mountinfoContainerRW, mountinfoEscaped, ""} {
		for _, cg := range []string{"0::/\n", "0::/user.slice/session-1.scope\n", "12:pids:/\n0::/docker/abc/x\n", "0::/gone (deleted)\n", "0:x:/\n", ""} {
			f.Add([]byte(mi), []byte(cg))
		}
	}
	f.Fuzz(func(t *testing.T, mountinfo, procCgroup []byte) {
		pl, err := findCgroupPlace(mountinfo, procCgroup)
		if err != nil {
			return
		}
		if !filepath.IsAbs(pl.mount) || !filepath.IsAbs(pl.dir) || filepath.Clean(pl.dir) != pl.dir {
			t.Fatalf("place %+v is not clean and absolute", pl)
		}
		if pl.dir != pl.mount && !strings.HasPrefix(pl.dir, strings.TrimSuffix(pl.mount, "/")+"/") {
			t.Fatalf("place %+v: the directory is not below the mount", pl)
		}
	})
}
