package agents

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// An agent's environment is an allowlist, decided by [Env] for every path (omp and pi over RPC, the
// ACP agents, a custom command, their MCP servers, `agenthost prompt`): the server's own variables
// (AGENTHOST_TOKEN, the cluster secret, its cloud credentials, ...) never reach a room, whose agent
// would otherwise drive the server's API or spend its keys. What custody and the launcher add to
// find and confine the processes (AGENTHOST_SCOPE, the policy) is added after, by them.

// baseEnv are the variables every agent gets as the server has them: what a shell, Node and Bun
// and the programs the agent's tools run need to work, and to reach the model through the host's
// proxy and certificate authorities.
var baseEnv = []string{
	"PATH", "TMPDIR", "TERM", "TZ", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE",
	"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO",
}

// baseEnvPrefixes are the prefixes of variables every agent gets (the locale's categories).
var baseEnvPrefixes = []string{"LC_"}

// ErrEnvName means a name given to pass to agents that is not a variable name, or is one of the
// server's own (AGENTHOST_*).
var ErrEnvName = errors.New("agents: not a variable an agent may be given")

// serverPrefix names the server's own variables, never given to an agent.
const serverPrefix = "AGENTHOST_"

// EnvOptions says what [Env] gives an agent besides the base.
type EnvOptions struct {
	// Home is the agent's HOME (required).
	Home string
	// Model is the model the room runs ("provider/id"): its provider's key variables pass (see
	// [ProviderKeys]). "" passes none (the built-in model needs no key).
	Model string
	// Providers are more providers whose keys pass (an ACP agent's own: claude's anthropic).
	Providers []string
	// Pass are more variable names passed as the server has them (serve --agent-env).
	// Names that [CheckEnvNames] refuses are left out.
	Pass []string
}

// Env returns the environment an agent is started with: from parent (the server's environment),
// the base variables (PATH, TERM, LANG and LC_*, the proxy and CA variables, ...), the key
// variables of the providers opts names and the names in opts.Pass, then HOME=opts.Home. Nothing
// else of parent passes, AGENTHOST_* never. A confined agent's TMPDIR is the room's (the launcher
// sets it).
func Env(parent []string, opts EnvOptions) []string {
	keep := map[string]bool{}
	for _, name := range baseEnv {
		keep[name] = true
	}
	providers := slices.Clone(opts.Providers)
	if p, _, ok := strings.Cut(opts.Model, "/"); ok && p != "" {
		providers = append(providers, p)
	}
	for _, p := range providers {
		for _, name := range ProviderKeys(p) {
			keep[name] = true
		}
	}
	for _, name := range opts.Pass {
		if CheckEnvNames([]string{name}) == nil {
			keep[name] = true
		}
	}
	env := make([]string, 0, len(keep)+8)
	seen := map[string]bool{}
	for _, kv := range parent {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || seen[name] || strings.HasPrefix(name, serverPrefix) || name == "HOME" {
			continue
		}
		if keep[name] || hasAnyPrefix(name, baseEnvPrefixes) {
			seen[name] = true
			env = append(env, kv)
		}
	}
	return append(env, "HOME="+opts.Home)
}

// EnvNames is what [Env] would give from parent, by name only, sorted (doctor prints it); left are
// the names of parent left out.
func EnvNames(parent []string, opts EnvOptions) (given, left []string) {
	in := map[string]bool{}
	for _, kv := range Env(parent, opts) {
		name, _, _ := strings.Cut(kv, "=")
		in[name] = true
		given = append(given, name)
	}
	for _, kv := range parent {
		name, _, _ := strings.Cut(kv, "=")
		if !in[name] && !slices.Contains(left, name) {
			left = append(left, name)
		}
	}
	slices.Sort(given)
	slices.Sort(left)
	return given, left
}

// CheckEnvNames refuses (with [ErrEnvName]) a name that is not a variable name or is the server's
// own (AGENTHOST_*): serve --agent-env checks its list with it.
func CheckEnvNames(names []string) error {
	for _, name := range names {
		if !validEnvName(name) {
			return fmt.Errorf("%w: %q is not a variable name", ErrEnvName, name)
		}
		if strings.HasPrefix(name, serverPrefix) {
			return fmt.Errorf("%w: %s is the server's own (AGENTHOST_* never reaches an agent)", ErrEnvName, name)
		}
		if name == "HOME" || name == "TMPDIR" {
			return fmt.Errorf("%w: %s is the room's own", ErrEnvName, name)
		}
	}
	return nil
}

func validEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i, c := range name {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// providerKeys are the variables the agents read a provider's key (or credentials) from, for the
// providers whose variables do not follow the PROVIDER_API_KEY pattern or that read more than one
// (measured in omp 18.2.3's and pi 0.73.1's provider tables).
var providerKeys = map[string][]string{
	"anthropic":              {"ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN"},
	"openai":                 {"OPENAI_API_KEY"},
	"openai-codex":           {"OPENAI_CODEX_OAUTH_TOKEN"},
	"codex":                  {"OPENAI_API_KEY", "CODEX_API_KEY"},
	"google":                 {"GEMINI_API_KEY", "GOOGLE_API_KEY"},
	"gemini":                 {"GEMINI_API_KEY", "GOOGLE_API_KEY"},
	"google-vertex":          {"GOOGLE_CLOUD_API_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION"},
	"amazon-bedrock":         {"AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_BEARER_TOKEN_BEDROCK"},
	"azure-openai-responses": {"AZURE_OPENAI_API_KEY", "AZURE_OPENAI_BASE_URL", "AZURE_OPENAI_RESOURCE_NAME", "AZURE_OPENAI_API_VERSION"},
	"github-copilot":         {"COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN"},
	"copilot":                {"COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN"},
	"huggingface":            {"HF_TOKEN", "HUGGINGFACE_HUB_TOKEN"},
	"vercel-ai-gateway":      {"AI_GATEWAY_API_KEY", "VERCEL_AI_GATEWAY_API_KEY"},
	"moonshotai":             {"MOONSHOT_API_KEY", "KIMI_API_KEY"},
	"kimi-coding":            {"KIMI_API_KEY"},
	"xai":                    {"XAI_API_KEY", "XAI_OAUTH_TOKEN"},
	"cloudflare-workers-ai":  {"CLOUDFLARE_API_KEY", "CLOUDFLARE_ACCOUNT_ID"},
	"cloudflare-ai-gateway":  {"CLOUDFLARE_API_KEY", "CLOUDFLARE_AI_GATEWAY_API_KEY", "CLOUDFLARE_ACCOUNT_ID"},
	"opencode-go":            {"OPENCODE_API_KEY"},
	"minimax-cn":             {"MINIMAX_CN_API_KEY"},
	"moonshotai-cn":          {"MOONSHOT_API_KEY"},
}

// ProviderKeys returns the variables an agent reads provider's key from: the known ones, else
// PROVIDER_API_KEY (upper case, dashes and dots as underscores: "deepseek" → DEEPSEEK_API_KEY).
func ProviderKeys(provider string) []string {
	if keys, ok := providerKeys[provider]; ok {
		return keys
	}
	if provider == "" {
		return nil
	}
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, provider)
	return []string{name + "_API_KEY"}
}

// kindProviders are the providers whose keys the ACP agents read by themselves.
var kindProviders = map[Kind][]string{Claude: {"anthropic"}, Codex: {"codex"}, Copilot: {"copilot"}}

// ompDirEnv pins the variables that move omp's configuration, data and plugin folders, to where
// they are by default: omp also loads .env files (of its home and its working directory) for the
// variables its environment does not set, and a relative XDG_DATA_HOME=. would make it load
// plugins from the workspace.
func ompDirEnv(home string) []string {
	return []string{
		"PI_CODING_AGENT_DIR=" + filepath.Join(home, ".omp", "agent"),
		"PI_CONFIG_DIR=.omp",
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"XDG_DATA_HOME=" + filepath.Join(home, ".local", "share"),
		"XDG_STATE_HOME=" + filepath.Join(home, ".local", "state"),
		"XDG_CACHE_HOME=" + filepath.Join(home, ".cache"),
	}
}

// homeEnv is [Env] of this process's environment for an agent of kind k whose home is dir, with
// what pins k's folders (omp's).
func homeEnv(dir string, k Kind, opts EnvOptions) []string {
	opts.Home = dir
	opts.Providers = append(slices.Clone(opts.Providers), kindProviders[k]...)
	env := Env(os.Environ(), opts)
	if k == OMP {
		env = append(env, ompDirEnv(dir)...)
	}
	return env
}

// OTLPOptions are the OTLP settings an agent that exports its own spans is given (serve
// --otlp-agents): nothing else of the server's.
type OTLPOptions struct {
	// TracesURL is the OTLP/HTTP traces endpoint (its full URL, /v1/traces included): the server's
	// relay for the room, which places the agent's spans in the room's turns and holds the
	// collector's own credentials, so the agent never has them.
	TracesURL string
	// Room names the agent's room on its spans' resource (agenthost.room.id).
	Room string
}

// OTLPEnv returns the variables that make an agent export its spans (omp's telemetry export reads
// them): OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, the protocol (http/protobuf, the only one omp sends),
// OTEL_TRACES_EXPORTER=otlp, and OTEL_RESOURCE_ATTRIBUTES naming the room. Only OTLP's own
// variables: nothing of the server's environment passes through here.
func OTLPEnv(o OTLPOptions) []string {
	if o.TracesURL == "" {
		return nil
	}
	env := []string{
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + o.TracesURL,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_TRACES_EXPORTER=otlp",
	}
	if o.Room != "" {
		// A room id is [A-Za-z0-9._-]: nothing to escape in the W3C baggage form.
		env = append(env, "OTEL_RESOURCE_ATTRIBUTES=agenthost.room.id="+o.Room)
	}
	return env
}
