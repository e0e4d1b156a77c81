package snapshot

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Real output of `git diff-tree -r -z --raw --no-abbrev --numstat`.
const rawSample = ":100644 100644 814f4a422927b82f5f8a43f8fab6d3839e3983f2 4c7442bcf5acd0f1e2a95fe4f12b12c6b779b585 M\x00a.txt\x00" +
	":100644 000000 61780798228d17af2d34fce4cfbdf35556832472 0000000000000000000000000000000000000000 D\x00d/b\tc.txt\x00" +
	":000000 120000 0000000000000000000000000000000000000000 8d14cbf983b3fad683171c9418998d9f68340823 A\x00link\x00" +
	":100644 100644 a20aca49adc3406f6b16092f4e8abf36357701a2 a98f84bab26c28b07bea3ee007c3ee4f0884ea56 M\x00logo.png\x00" +
	"1\t1\ta.txt\x000\t1\td/b\tc.txt\x001\t0\tlink\x00-\t-\tlogo.png\x00"

func TestParseRawDiff(t *testing.T) {
	cs, err := parseRawDiff([]byte(rawSample))
	if err != nil {
		t.Fatal(err)
	}
	var got []File
	for _, c := range cs {
		got = append(got, c.File)
	}
	want := []File{
		{Path: "a.txt", Status: StatusModified, Insertions: 1, Deletions: 1},
		{Path: "d/b\tc.txt", Status: StatusDeleted, Deletions: 1},
		{Path: "link", Status: StatusAdded, Insertions: 1},
		{Path: "logo.png", Status: StatusModified, Binary: true},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if cs[2].newMode != "120000" || cs[2].newBlob != "8d14cbf983b3fad683171c9418998d9f68340823" {
		t.Errorf("link entry %+v", cs[2])
	}
	for _, bad := range []string{":100644 M\x00a\x00", "1\t1\tunknown\x00", ":100644 100644 a b M\x00", "x\ty\x00"} {
		if _, err := parseRawDiff([]byte(bad)); err == nil {
			t.Errorf("parseRawDiff(%q) accepted it", bad)
		}
	}
}

func FuzzParseRawDiff(f *testing.F) {
	f.Add([]byte(rawSample))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		cs, err := parseRawDiff(b)
		if err != nil {
			return
		}
		for _, c := range cs {
			if c.Insertions < 0 || c.Deletions < 0 || c.Path == "" {
				t.Errorf("negative counts or no path in %+v", c)
			}
		}
	})
}

// Real output of `git status --porcelain=v2 -z -uall --ignored=matching`,
// with an entry staged by an interrupted snapshot.
const statusSample = "1 .M N... 100644 100644 100644 1017f2d5a3ec429502994596e61c3654d885cfb7 1017f2d5a3ec429502994596e61c3654d885cfb7 d5/sub/f5.txt\x00" +
	"1 .D N... 100644 100644 000000 5e6f04c1e9763f0b1d4dad42126fc25a7d98ce8e 5e6f04c1e9763f0b1d4dad42126fc25a7d98ce8e d6/sub/f 7.txt\x00" +
	"1 A. N... 000000 100644 100644 0000000000000000000000000000000000000000 41ae81158e135a72c498fc9ec5e19ffe925e2e16 staged.txt\x00" +
	"? build2/.gitignore\x00? d6/sub/f8.txt.l\x00? nested/\x00! a.log\x00! build/\x00"

func TestParseStatus(t *testing.T) {
	st := parseStatus([]byte(statusSample))
	want := status{
		changed: []lsEntry{{'C', "d5/sub/f5.txt"}, {'C', "d6/sub/f 7.txt"}, {'?', "build2/.gitignore"}, {'?', "d6/sub/f8.txt.l"}, {'?', "nested/"}},
		ignored: []lsEntry{{'?', "a.log"}, {'?', "build/"}},
		staged:  true,
	}
	if d := cmp.Diff(want, st, cmp.AllowUnexported(status{}, lsEntry{})); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func FuzzParseStatus(f *testing.F) {
	f.Add([]byte(statusSample))
	f.Fuzz(func(t *testing.T, b []byte) {
		st := parseStatus(b)
		for _, e := range append(st.changed, st.ignored...) {
			if e.path == "" {
				t.Errorf("empty path from %q", b)
			}
		}
	})
}

func TestVersionAtLeast(t *testing.T) {
	for out, want := range map[string]bool{
		"git version 2.39.5\n":                 true,
		"git version 2.32.0":                   true,
		"git version 2.31.8":                   false,
		"git version 3.0.0":                    true,
		"git version 2.39.5.windows.1":         true,
		"git version 2.37.1 (Apple Git-137.1)": true,
		"git version 1.9":                      false,
		"git version 2":                        false,
		"not git":                              false,
		"":                                     false,
		"git version 2.x":                      false,
	} {
		if got := versionAtLeast(out, MinGitVersion); got != want {
			t.Errorf("versionAtLeast(%q) = %v, want %v", out, got, want)
		}
	}
}
