package gitws_test

import (
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agenthost/agenthost/internal/gitws"
)

// TestEngine_HTTPSCredentials: a repository served over https that wants a password: a token in
// the URL is refused before anything runs (nothing to store or show), and the way the README
// gives instead works: a credential helper in the server's own git configuration (here through
// GIT_CONFIG_GLOBAL; ~/.gitconfig works the same) answers git, and nothing of it reaches the
// room's worktree or the record.
func TestEngine_HTTPSCredentials(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	const user, token = "x-access-token", "FAKE-TOKEN-0123456789"
	bare := filepath.Join(t.TempDir(), "srv")
	git(t, r.dir, "clone", "--quiet", "--bare", r.dir, filepath.Join(bare, "repo.git"))
	gitExec := git(t, r.dir, "--exec-path")
	backend := &cgi.Handler{Path: filepath.Join(gitExec, "git-http-backend"),
		Env: []string{"GIT_PROJECT_ROOT=" + bare, "GIT_HTTP_EXPORT_ALL=1"}}
	var asked, refused atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u, p, ok := req.BasicAuth()
		if !ok || u != user || p != token {
			refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		asked.Add(1)
		backend.ServeHTTP(w, req)
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	writeFile(t, ca, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	url := srv.URL + "/repo.git"
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GIT_SSL_CAINFO=" + ca}

	// Without credentials: git is refused, and asks nobody.
	e := newEngine(t, gitws.Options{Env: env})
	ctx := tctx(t)
	if err := e.Validate(ctx, gitws.Spec{Git: url, Ref: "main"}); !errors.Is(err, gitws.ErrUnreachable) {
		t.Fatalf("no credentials: %v, want ErrUnreachable", err)
	}
	// A token in the URL, as a user name or a password: refused before any request.
	before := refused.Load() + asked.Load()
	for _, u := range []string{strings.Replace(url, "https://", "https://"+token+"@", 1),
		strings.Replace(url, "https://", "https://"+user+":"+token+"@", 1)} {
		if err := e.Validate(ctx, gitws.Spec{Git: u, Ref: "main"}); !errors.Is(err, gitws.ErrBadSpec) || strings.Contains(err.Error(), token) {
			t.Errorf("Validate with the token in the URL = %v, want ErrBadSpec without the token", err)
		}
	}
	if refused.Load()+asked.Load() != before {
		t.Errorf("a URL with credentials reached the server")
	}

	// A credential helper in the server's git configuration.
	helper := filepath.Join(dir, "helper")
	writeFile(t, helper, "#!/bin/sh\ntest \"$1\" = get && printf 'username=%s\\npassword=%s\\n' "+user+" "+token+"\n")
	if err := os.Chmod(helper, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "gitconfig")
	writeFile(t, cfg, "[credential]\n\thelper = "+helper+"\n")
	e = newEngine(t, gitws.Options{Env: append(env, "GIT_CONFIG_GLOBAL="+cfg)})
	if err := e.Validate(ctx, gitws.Spec{Git: url, Ref: "main"}); err != nil {
		t.Fatalf("with a credential helper: %v", err)
	}
	ready, err := e.Prepare(ctx, "room", gitws.Spec{Git: url, Ref: "dev"})
	if err != nil || ready.Commit != r.dev || ready.URL != url {
		t.Fatalf("Prepare with a credential helper: %+v %v", ready, err)
	}
	if asked.Load() == 0 {
		t.Error("the server was never asked with the credentials")
	}
	for _, p := range []string{filepath.Join(ready.Dir, ".git", "config"), filepath.Join(ready.Mirror, "config")} {
		if strings.Contains(readFile(t, p), token) {
			t.Errorf("%s holds the token", p)
		}
	}
}
