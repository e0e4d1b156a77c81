package buildinfo

import "testing"

func TestName(t *testing.T) {
	for _, c := range []struct {
		module, rev string
		modified    bool
		want        string
	}{
		{"", "", false, "devel"},
		{"(devel)", "f82a31f0c2d1aaaa", false, "devel+f82a31f0c2d1"},
		{"(devel)", "f82a31f0c2d1aaaa", true, "devel+f82a31f0c2d1.dirty"},
		{"v0.0.0-20261201154500-f82a31f0c2d1", "f82a31f0c2d1aaaa", false, "v0.0.0-20261201154500-f82a31f0c2d1"},
		{"v0.0.0-20261201154500-f82a31f0c2d1+dirty", "f82a31f0c2d1aaaa", true, "v0.0.0-20261201154500-f82a31f0c2d1+dirty"},
		{"v1.2.0", "f82a31f0c2d1aaaa", false, "v1.2.0+f82a31f0c2d1"},
	} {
		if got := name(c.module, c.rev, c.modified); got != c.want {
			t.Errorf("name(%q, %q, %v) = %q, want %q", c.module, c.rev, c.modified, got, c.want)
		}
	}
}
