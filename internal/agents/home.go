package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// ModelID is the --model flag value that selects the scripted model in a [Home].
const ModelID = "fake/fake-model"

// The provider and model names behind ModelID.
const (
	providerName = "fake"
	modelName    = "fake-model"
	// piAPIKey is sent by pi as a bearer token; pi refuses a provider without one. It is not
	// the name of an environment variable, so pi uses it literally.
	piAPIKey = "modelsim-no-key"
)

// The scripted model's price in dollars per million tokens, registered with every agent whose
// model registration takes a price (omp's and pi's homes), so that their usage reports carry a
// cost above zero. The figures are Claude Sonnet's list prices; the model costs nothing to run.
const (
	PriceInput      = 3.0
	PriceOutput     = 15.0
	PriceCacheRead  = 0.30
	PriceCacheWrite = 3.75
)

// Cost is what the given token counts cost, in dollars, at the scripted model's price: what omp
// and pi compute for one assistant message (each bucket priced per million tokens, then summed).
func Cost(input, output, cacheRead, cacheWrite int64) float64 {
	return PriceInput/1e6*float64(input) + PriceOutput/1e6*float64(output) +
		PriceCacheRead/1e6*float64(cacheRead) + PriceCacheWrite/1e6*float64(cacheWrite)
}

// The wire APIs a Home can point an agent at.
const (
	APICompletions = "openai-completions"
	APIResponses   = "openai-responses"
)

// ErrAPI means a HomeOptions.API other than APICompletions or APIResponses.
var ErrAPI = errors.New("agents: unsupported api")

// HomeOptions adjusts [HomeWith]. The zero value gives the defaults of [Home].
type HomeOptions struct {
	// API is the wire API the agent speaks to the model: APICompletions (the default when
	// empty) or APIResponses.
	API string
	// Owner, if set, gets what HomeWith writes (the agent runs as a user of its own).
	Owner *agentfs.Owner
	// PassEnv are more variables the agent gets as the server has them (see [EnvOptions.Pass]).
	PassEnv []string
}

// Home writes a fresh agent home under dir for kind k whose only provider is the scripted model
// at modelURL (e.g. "http://127.0.0.1:PORT/v1"), over the chat completions API, and returns the
// environment to run the agent with. See [HomeWith].
func Home(dir string, k Kind, modelURL string) ([]string, error) {
	return HomeWith(dir, k, modelURL, HomeOptions{})
}

// HomeWith is [Home] with options. It creates dir if needed and writes (through agentfs: a link
// the agent planted there is replaced, never written through), for OMP,
// .omp/agent/models.yml (auth none, the model priced at PriceInput etc.) and .omp/agent/config.yml (no update checks, no plugin
// auto-update, no local model server probes, no auto-QA); for Pi, .pi/agent/models.json (with a
// placeholder apiKey, which pi requires).
//
// The returned environment is [Env]'s with no provider's key (the agent can reach no other model)
// and the names in opts.PassEnv; plus HOME=dir, omp's folders pinned, the switches that keep the
// agents offline and quiet, and 127.0.0.1 in NO_PROXY. Run the agent with "--model", [ModelID].
func HomeWith(dir string, k Kind, modelURL string, opts HomeOptions) ([]string, error) {
	api := opts.API
	if api == "" {
		api = APICompletions
	}
	if api != APICompletions && api != APIResponses {
		return nil, fmt.Errorf("%w: %q", ErrAPI, api)
	}
	if modelURL == "" {
		return nil, errors.New("agents: empty model URL")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("agents: home dir: %w", err)
	}
	model := map[string]any{
		"id": modelName, "name": "Scripted model (modelsim)", "reasoning": false, "input": []string{"text"},
		"contextWindow": 1000000, "maxTokens": 4096,
		"cost": map[string]float64{
			"input": PriceInput, "output": PriceOutput, "cacheRead": PriceCacheRead, "cacheWrite": PriceCacheWrite,
		},
	}
	provider := map[string]any{"baseUrl": modelURL, "api": api, "models": []any{model}}
	models := map[string]any{"providers": map[string]any{providerName: provider}}

	switch k {
	case OMP:
		provider["auth"] = "none"
		agentDir := filepath.Join(".omp", "agent")
		// JSON is valid YAML, and encoding it with encoding/json quotes the URL safely.
		if err := writeJSON(dir, opts.Owner, filepath.Join(agentDir, "models.yml"), models); err != nil {
			return nil, err
		}
		if err := writeOMPConfig(dir, opts.Owner, true); err != nil {
			return nil, err
		}
	case Pi:
		provider["apiKey"] = piAPIKey
		if err := writeJSON(dir, opts.Owner, filepath.Join(".pi", "agent", "models.json"), models); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: %q", ErrKind, k)
	}
	return builtinEnv(os.Environ(), dir, k, opts.PassEnv), nil
}

// writeOMPConfig writes omp's settings into home: no update checks, no plugin auto-update, no
// auto-QA and, on the built-in model, no local model server probes. Whatever settings the home
// held are replaced (a room's agent may have written them; see ResetHome).
func writeOMPConfig(home string, owner *agentfs.Owner, builtin bool) error {
	config := map[string]any{
		"startup":     map[string]any{"checkUpdate": false},
		"marketplace": map[string]any{"autoUpdate": "off"},
		"dev":         map[string]any{"autoqa": false},
	}
	if builtin {
		// Otherwise omp probes 127.0.0.1:11434, :8080 and :1234 for local model servers.
		config["disabledProviders"] = ompLocalModelProviders
	}
	return writeJSON(home, owner, filepath.Join(".omp", "agent", "config.yml"), config)
}

// deadProxy is a loopback address where nothing listens (port 9 is the "discard" service).
const deadProxy = "http://127.0.0.1:9"

// quietEnv are the variables set for every agent; the comments say what each one switches off.
var quietEnv = []string{
	"PI_OFFLINE=1",            // pi: no startup network operations (version check, tool downloads)
	"PI_SKIP_VERSION_CHECK=1", // pi: no npm version check (PI_OFFLINE implies it; explicit for clarity)
	"PI_TELEMETRY=0",          // pi: no install telemetry or attribution headers
	"PI_AUTO_QA=0",            // omp: no auto-QA issue reporting device (qa.omp.sh) in the prompt
	"OMP_SKIP_SETUP=1",        // omp: never run the setup wizard, even on a terminal
	"DO_NOT_TRACK=1",          // bun: no crash report uploads
	// omp: route the agent's own outbound fetches (background model catalog refreshes of a dozen
	// keyless providers, web search) to a closed loopback port so they fail at once without DNS.
	// omp sends loopback and NO_PROXY hosts direct, so the scripted model is unaffected; the
	// variable means nothing to pi or to programs the bash tool runs.
	"PI_PROXY=" + deadProxy,
}

// builtinEnv is the environment of an agent of kind k on the built-in model: [Env] of parent with
// no provider's key, omp's folders pinned, quietEnv, and loopback in NO_PROXY.
func builtinEnv(parent []string, home string, k Kind, pass []string) []string {
	base := Env(parent, EnvOptions{Home: home, Pass: pass})
	env := make([]string, 0, len(base)+len(quietEnv)+8)
	var noProxy string
	for _, kv := range base {
		name, val, _ := strings.Cut(kv, "=")
		if name == "NO_PROXY" || name == "no_proxy" {
			if val != "" && noProxy == "" {
				noProxy = val
			}
			continue
		}
		env = append(env, kv)
	}
	// Bun's fetch honours HTTP(S)_PROXY; the scripted model must never be reached through one.
	loopback := "127.0.0.1,localhost"
	if noProxy != "" {
		loopback = noProxy + "," + loopback
	}
	env = append(env, "NO_PROXY="+loopback, "no_proxy="+loopback)
	if k == OMP {
		env = append(env, ompDirEnv(home)...)
	}
	return append(env, quietEnv...)
}

// writeJSON writes v, indented, to name in the agent's home (created if needed): see writeFile.
func writeJSON(home string, owner *agentfs.Owner, name string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("agents: encoding %s: %w", filepath.Base(name), err)
	}
	return writeFile(home, owner, name, append(data, '\n'))
}

// writeFile writes data to name (0600) in the agent's home (created 0700 if needed), given to
// owner: through agentfs, so that a link the agent planted at name or at a folder on the way is
// replaced, never written through.
func writeFile(home string, owner *agentfs.Owner, name string, data []byte) error {
	d, err := agentfs.Create(home, 0o700, owner)
	if err != nil {
		return fmt.Errorf("agents: home dir: %w", err)
	}
	defer d.Close()
	if err := d.WriteFile(name, data, 0o600); err != nil {
		return fmt.Errorf("agents: %w", err)
	}
	return nil
}
