package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"

	sdk "github.com/coder/acp-go-sdk"
)

// PermissionRequest is the agent's session/request_permission, as the
// Permission callback sees it.
type PermissionRequest struct {
	SessionID  string
	ToolCallID string
	// Title is the tool call's title ("" if the agent sent none); Kind its
	// tool kind ("execute", "edit", ...).
	Title, Kind string
	// RawInput is the tool call's input as the agent sent it (JSON; nil
	// if none). The callback bounds and redacts it before showing it.
	RawInput json.RawMessage
	Options  []sdk.PermissionOption
}

// maxInbound bounds the agent's requests handled at once (the SDK runs
// each in a goroutine of its own); beyond it a request is refused at once:
// a permission denied, a question cancelled, an fs request failed.
const maxInbound = 32

// errBusy refuses an inbound request over maxInbound.
var errBusy = errors.New("acp: too many requests from the agent at once")

// inbound registers an inbound request; false when over maxInbound or
// closed. done must be called when true.
func (c *Client) inbound() (ok bool) {
	if c.inflight.Add(1) > maxInbound {
		c.inflight.Add(-1)
		return false
	}
	if !c.enter() {
		c.inflight.Add(-1)
		return false
	}
	return true
}

func (c *Client) inboundDone() {
	c.inflight.Add(-1)
	c.handlers.Done()
}

// sdkClient is the Client as the SDK calls it.
type sdkClient Client

var _ sdk.Client = (*sdkClient)(nil)

// errNoTerminal answers terminal/* requests: terminals are not advertised.
var errNoTerminal = sdk.NewMethodNotFound("terminal/* (not advertised by this client)")

// recovered turns a panic in a handler the SDK runs (which would take the
// whole host down: the SDK does not recover) into an internal error answer.
func (c *Client) recovered(method string, err *error) {
	if r := recover(); r != nil {
		c.opts.Logger.Error("acp: a handler panicked; answered an internal error", "method", method,
			"panic", trim(fmt.Sprint(r), 200), "stack", trim(string(debug.Stack()), 4000))
		*err = sdk.NewInternalError(map[string]any{"error": "internal error in the client"})
	}
}

func (s *sdkClient) RequestPermission(ctx context.Context, p sdk.RequestPermissionRequest) (resp sdk.RequestPermissionResponse, err error) {
	c := (*Client)(s)
	defer c.recovered(sdk.ClientMethodSessionRequestPermission, &err)
	session := string(p.SessionId)
	if !c.inbound() {
		return sdk.RequestPermissionResponse{Outcome: c.outcome(session, p.Options, false)}, nil
	}
	defer c.inboundDone()
	req := PermissionRequest{SessionID: session, ToolCallID: string(p.ToolCall.ToolCallId), Options: p.Options}
	if p.ToolCall.Title != nil {
		req.Title = *p.ToolCall.Title
	}
	if p.ToolCall.Kind != nil {
		req.Kind = string(*p.ToolCall.Kind)
	}
	if p.ToolCall.RawInput != nil {
		req.RawInput, _ = json.Marshal(p.ToolCall.RawInput)
	}
	allow := false
	if c.opts.Permission != nil && !c.isCancelled(session) {
		dctx, cancel := context.WithTimeout(ctx, c.opts.PermissionTimeout)
		// Cancelling the turn cuts the decision short.
		if pctx := c.promptCtx(session); pctx != nil {
			stop := context.AfterFunc(pctx, cancel)
			defer stop()
		}
		allow = c.opts.Permission(dctx, req)
		// An answer that came after the deadline does not count.
		if dctx.Err() != nil {
			allow = false
		}
		cancel()
	}
	return sdk.RequestPermissionResponse{Outcome: c.outcome(session, p.Options, allow)}, nil
}

// outcome answers a permission request: cancelled once the session was sent
// session/cancel (ACP: every pending or later request of a cancelled turn),
// else the option pick chooses.
func (c *Client) outcome(session string, opts []sdk.PermissionOption, allow bool) sdk.RequestPermissionOutcome {
	if c.isCancelled(session) {
		return cancelledOutcome()
	}
	return pick(opts, allow)
}

func cancelledOutcome() sdk.RequestPermissionOutcome {
	return sdk.RequestPermissionOutcome{Cancelled: &sdk.RequestPermissionOutcomeCancelled{Outcome: "cancelled"}}
}

// pick chooses the option that says allow (or deny) once, else always;
// a denial with no reject option is the cancelled outcome, and so is a
// choice whose id another option shares (the agent could take it for the
// other one).
func pick(opts []sdk.PermissionOption, allow bool) sdk.RequestPermissionOutcome {
	kinds := []sdk.PermissionOptionKind{sdk.PermissionOptionKindRejectOnce, sdk.PermissionOptionKindRejectAlways}
	if allow {
		kinds = []sdk.PermissionOptionKind{sdk.PermissionOptionKindAllowOnce, sdk.PermissionOptionKindAllowAlways}
	}
	for _, k := range kinds {
		for _, o := range opts {
			if o.Kind != k {
				continue
			}
			n := 0
			for _, other := range opts {
				if other.OptionId == o.OptionId {
					n++
				}
			}
			if n > 1 {
				return cancelledOutcome()
			}
			return sdk.RequestPermissionOutcome{Selected: &sdk.RequestPermissionOutcomeSelected{OptionId: o.OptionId, Outcome: "selected"}}
		}
	}
	return cancelledOutcome()
}

// SessionUpdate is never called: updates are decoded before the SDK.
func (s *sdkClient) SessionUpdate(context.Context, sdk.SessionNotification) error { return nil }

func (s *sdkClient) ReadTextFile(ctx context.Context, p sdk.ReadTextFileRequest) (resp sdk.ReadTextFileResponse, err error) {
	c := (*Client)(s)
	defer c.recovered(sdk.ClientMethodFsReadTextFile, &err)
	if !c.inbound() {
		return sdk.ReadTextFileResponse{}, errBusy
	}
	defer c.inboundDone()
	if c.fs == nil {
		return sdk.ReadTextFileResponse{}, sdk.NewMethodNotFound(sdk.ClientMethodFsReadTextFile)
	}
	text, err := c.fs.read(p.Path, p.Line, p.Limit)
	if err != nil {
		return sdk.ReadTextFileResponse{}, fsErr(err)
	}
	return sdk.ReadTextFileResponse{Content: text}, nil
}

func (s *sdkClient) WriteTextFile(ctx context.Context, p sdk.WriteTextFileRequest) (resp sdk.WriteTextFileResponse, err error) {
	c := (*Client)(s)
	defer c.recovered(sdk.ClientMethodFsWriteTextFile, &err)
	if !c.inbound() {
		return sdk.WriteTextFileResponse{}, errBusy
	}
	defer c.inboundDone()
	if c.fs == nil {
		return sdk.WriteTextFileResponse{}, sdk.NewMethodNotFound(sdk.ClientMethodFsWriteTextFile)
	}
	if err := c.fs.write(p.Path, p.Content); err != nil {
		return sdk.WriteTextFileResponse{}, fsErr(err)
	}
	return sdk.WriteTextFileResponse{}, nil
}

// fsErr answers an fs request with the reason but not the host's paths
// beyond what the agent sent.
func fsErr(err error) error {
	if errors.Is(err, ErrOutsideRoot) || errors.Is(err, ErrNotRegular) {
		return sdk.NewInvalidParams(map[string]any{"error": err.Error()})
	}
	return sdk.NewInternalError(map[string]any{"error": err.Error()})
}

func (s *sdkClient) CreateTerminal(context.Context, sdk.CreateTerminalRequest) (sdk.CreateTerminalResponse, error) {
	return sdk.CreateTerminalResponse{}, errNoTerminal
}

func (s *sdkClient) KillTerminal(context.Context, sdk.KillTerminalRequest) (sdk.KillTerminalResponse, error) {
	return sdk.KillTerminalResponse{}, errNoTerminal
}

func (s *sdkClient) TerminalOutput(context.Context, sdk.TerminalOutputRequest) (sdk.TerminalOutputResponse, error) {
	return sdk.TerminalOutputResponse{}, errNoTerminal
}

func (s *sdkClient) ReleaseTerminal(context.Context, sdk.ReleaseTerminalRequest) (sdk.ReleaseTerminalResponse, error) {
	return sdk.ReleaseTerminalResponse{}, errNoTerminal
}

func (s *sdkClient) WaitForTerminalExit(context.Context, sdk.WaitForTerminalExitRequest) (sdk.WaitForTerminalExitResponse, error) {
	return sdk.WaitForTerminalExitResponse{}, errNoTerminal
}

// Question is one field of an agent's elicitation form (omp's ask tool):
// the room asks it as a question.
type Question struct {
	// Field is the form field's name; Title what to ask (the form's
	// message, and the field's own title or description).
	Field, Title string
	// Options are the allowed values (enum or oneOf consts), nil for free
	// text; Multi: the answer is a list (one chosen value); Type is the
	// field's JSON type.
	Options []string
	Multi   bool
	Type    string
	// other is the free-text field that takes an answer outside Options
	// (omp pairs field F with "F__other").
	other string
}

// UnstableCreateElicitation answers a form elicitation by asking each of
// its fields through Options.Ask: accepted when every field was answered,
// cancelled otherwise. URL elicitations are declined.
func (s *sdkClient) UnstableCreateElicitation(ctx context.Context, p sdk.UnstableCreateElicitationRequest) (resp sdk.UnstableCreateElicitationResponse, err error) {
	c := (*Client)(s)
	defer c.recovered(sdk.ClientMethodElicitationCreate, &err)
	if !c.inbound() {
		return sdk.UnstableCreateElicitationResponse{Cancel: &sdk.UnstableCreateElicitationCancel{Action: "cancel"}}, nil
	}
	defer c.inboundDone()
	if p.Form == nil || c.opts.Ask == nil {
		return sdk.UnstableCreateElicitationResponse{Decline: &sdk.UnstableCreateElicitationDecline{Action: "decline"}}, nil
	}
	qs := formQuestions(p.Form.Message, p.Form.RequestedSchema)
	content := map[string]any{}
	for _, q := range qs {
		qctx, cancel := context.WithTimeout(ctx, c.opts.PermissionTimeout)
		ans, ok := c.opts.Ask(qctx, q)
		if qctx.Err() != nil {
			ok = false
		}
		cancel()
		if !ok {
			return sdk.UnstableCreateElicitationResponse{Cancel: &sdk.UnstableCreateElicitationCancel{Action: "cancel"}}, nil
		}
		if q.other != "" && !slices.Contains(q.Options, strings.TrimSpace(ans)) {
			content[q.other] = strings.TrimSpace(ans)
			continue
		}
		content[q.Field] = answerValue(q, ans)
	}
	return sdk.UnstableCreateElicitationResponse{Accept: &sdk.UnstableCreateElicitationAccept{Action: "accept", Content: content}}, nil
}

// otherSuffixes mark the free-text partner of a choice field: "F__other"
// in omp's ask forms, "F_custom" in claude-agent-acp's AskUserQuestion
// forms (where it is optional, like every field).
var otherSuffixes = []string{"__other", "_custom"}

// partnerOf returns the choice field whose free-text partner n is, if any.
func partnerOf(n string, props map[string]any) (string, bool) {
	for _, suf := range otherSuffixes {
		if base, ok := strings.CutSuffix(n, suf); ok && props[base] != nil {
			return base, true
		}
	}
	return "", false
}

// formQuestions lists a form's fields to ask, required ones first, each in
// name order: optional fields are left out when the form has required
// ones, and a choice field's free-text partner is asked with it, as one
// question.
func formQuestions(message string, schema sdk.UnstableElicitationSchema) []Question {
	names := make([]string, 0, len(schema.Properties))
	for n := range schema.Properties {
		names = append(names, n)
	}
	req := map[string]bool{}
	for _, n := range schema.Required {
		req[n] = true
	}
	slices.SortFunc(names, func(a, b string) int {
		if req[a] != req[b] {
			if req[a] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	out := make([]Question, 0, len(names))
	for _, n := range names {
		if _, ok := partnerOf(n, schema.Properties); ok {
			continue // asked with its choice field
		}
		if len(req) > 0 && !req[n] {
			continue
		}
		var f struct {
			Type        string `json:"type"`
			Title       string `json:"title"`
			Description string `json:"description"`
			Enum        []any  `json:"enum"`
			OneOf       []struct {
				Const any    `json:"const"`
				Title string `json:"title"`
			} `json:"oneOf"`
			Items struct {
				Enum  []any `json:"enum"`
				AnyOf []struct {
					Const any `json:"const"`
				} `json:"anyOf"`
			} `json:"items"`
		}
		b, _ := json.Marshal(schema.Properties[n])
		_ = json.Unmarshal(b, &f)
		q := Question{Field: n, Type: f.Type, Title: message, Multi: f.Type == "array"}
		if t := cmpOr(f.Title, f.Description); t != "" && t != message {
			q.Title = strings.TrimSpace(message + "\n" + t)
		}
		for _, v := range append(f.Enum, f.Items.Enum...) {
			q.Options = append(q.Options, fmt.Sprint(v))
		}
		for _, o := range f.OneOf {
			q.Options = append(q.Options, fmt.Sprint(o.Const))
		}
		for _, o := range f.Items.AnyOf {
			q.Options = append(q.Options, fmt.Sprint(o.Const))
		}
		if f.Type == "boolean" {
			q.Options = []string{"yes", "no"}
		}
		for _, suf := range otherSuffixes {
			if schema.Properties[n+suf] != nil && q.other == "" {
				q.other = n + suf
			}
		}
		out = append(out, q)
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// answerValue types a person's answer for the field.
func answerValue(q Question, ans string) any {
	ans = strings.TrimSpace(ans)
	switch q.Type {
	case "boolean":
		return strings.EqualFold(ans, "yes") || strings.EqualFold(ans, "true")
	case "number", "integer":
		var n json.Number
		if json.Unmarshal([]byte(ans), &n) == nil {
			return n
		}
	case "array":
		return []string{ans}
	}
	return ans
}
